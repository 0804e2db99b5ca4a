"""New weights into every tensor-parallel rank of a vLLM engine.

With ``rollout.vllm.tensor_parallel_size=k`` above 1, vLLM runs the model in k worker processes of
its multiprocessing executor, one per GPU of the rollout worker's placement bundle; the rollout
worker (the Ray actor) holds only the ``LLM`` object. Weights therefore reach each rank through
:class:`WeightReceiver`, a vLLM worker extension (``worker_extension_cls``) whose methods every rank
runs through ``LLM.collective_rpc``; what crosses vLLM's message queue is a path or a few hundred
bytes of handles per tensor, never the weights themselves:

* host tensors (``rollout.weight_sync=packed``, or a broadcast received on CPU): written once into
  a file in ``/dev/shm`` (:func:`write_shared_file`; the temporary directory when ``/dev/shm`` is too
  small, as in containers started with Docker's 64 MiB default), which every rank maps read-only and
  loads; the file is removed once every rank returned;
* CUDA tensors of the rollout worker (a broadcast received on its first GPU): CUDA IPC handles
  (:func:`agentrl.weights.ipc.ipc_handles`), opened by every rank on the same node, which
  copies its own shard to its GPU;
* the learner's CUDA IPC handles (``rollout.weight_sync=ipc``, colocated layout): one set per
  learner GPU; each rank opens the set of its own GPU
  (:func:`~agentrl.weights.ipc.pick_handle_set`), so no byte crosses GPUs.

Each rank loads with the worker's own ``reload_weights`` (every supported release; see
:mod:`agentrl.generation.vllm.compat`), so vLLM's weight loaders cut each rank's shard.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch

from agentrl.weights.base import aligned, byte_view, device_uuid
from agentrl.weights.ipc import IpcWeights, local_device_index, open_ipc_handles, pick_handle_set

EXTENSION = "agentrl.generation.vllm.ranks.WeightReceiver"   # engine argument worker_extension_cls
SHARED_DIR = "/dev/shm"

Entry = tuple[str, str, tuple[int, ...], int, int]   # name, dtype name, shape, byte offset, byte count


def write_shared_file(state: Mapping[str, torch.Tensor], directory: str | None = None) -> tuple[str, list[Entry]]:
    """Copy ``state`` (host tensors) back to back into a new file, in ``/dev/shm`` when it has room; the
    file's path and where each tensor sits in it. The caller removes the file."""
    entries: list[Entry] = []
    size = 0
    for name, tensor in state.items():
        count = tensor.numel() * tensor.element_size()
        entries.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), size, count))
        size += aligned(count)
    if directory is None:
        fits = os.path.isdir(SHARED_DIR) and shutil.disk_usage(SHARED_DIR).free > size + (64 << 20)
        directory = SHARED_DIR if fits else tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="agentrl-weights-", dir=directory)
    try:
        os.ftruncate(fd, max(size, 1))
        mapped = np.memmap(path, dtype=np.uint8, mode="r+", shape=(max(size, 1),))
        flat = torch.from_numpy(mapped)
        for (name, _, _, offset, count), tensor in zip(entries, state.values()):
            flat[offset:offset + count].copy_(byte_view(tensor.cpu()))
        mapped.flush()
        del flat, mapped
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path, entries


def read_shared_file(path: str, entries: Sequence[Entry]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views of a file from :func:`write_shared_file` (mapped read-only, no copy)."""
    size = max((offset + count for _, _, _, offset, count in entries), default=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)     # torch warns that the read-only map is not writable
        flat = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="r", shape=(max(size, 1),)))
    return [(name, flat[offset:offset + count].view(getattr(torch, dtype)).view(shape))
            for name, dtype, shape, offset, count in entries]


def _visible_uuids() -> list[str]:
    return [device_uuid(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


class WeightReceiver:
    """Methods of every vLLM worker (one per tensor-parallel rank), called with ``LLM.collective_rpc``.

    Named ``agentrl_*`` so that they never clash with the worker's own (vLLM refuses an extension
    that would override a worker attribute)."""

    def _agentrl_reload(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.reload_weights(weights_iterator=weights)

    def agentrl_device_uuid(self) -> str | None:
        """This rank's GPU (None on CPU)."""
        device = getattr(self, "device", None)
        if device is None or getattr(device, "type", "cpu") != "cuda":
            return None
        return device_uuid(device.index if device.index is not None else torch.cuda.current_device())

    def agentrl_load_file(self, path: str, entries: Sequence[Entry]) -> int:
        """Load the weights of a shared file (:func:`write_shared_file`); how many tensors."""
        weights = read_shared_file(path, entries)
        self._agentrl_reload(weights)
        return len(weights)

    def agentrl_load_ipc(self, handle_sets: Sequence[IpcWeights]) -> int:
        """Load weights from CUDA IPC handles (the set on this rank's GPU when there is one); the copies
        are finished when this returns, so the sender may free its tensors."""
        chosen = pick_handle_set(handle_sets, self.agentrl_device_uuid(), _visible_uuids())
        local_device_index(chosen.device_uuid)      # a clear error when this rank cannot see that GPU
        state = open_ipc_handles(chosen)
        self._agentrl_reload(state.items())
        torch.cuda.synchronize()
        count = len(state)
        del state
        return count


__all__ = ["EXTENSION", "WeightReceiver", "read_shared_file", "write_shared_file"]
