"""Weights from the learner to the rollout workers, packed into flat byte buckets.

A weight sync used to put a ``{name: tensor}`` dict into Ray's object store. Ray pickles a
tensor's storage in band, so its bytes were copied into the pickle on the way in and into a
freshly rebuilt tensor on the way out, before the backend copied them into its model. Here the
weights are copied once into flat ``uint8`` NumPy buckets (straight from the learner's device), and
NumPy arrays travel through the object store out of band: a worker's ``ray.get`` maps the stored
bucket without copying it, and :meth:`PackedWeights.tensors` gives read-only views into it that
the backend copies into its model.

    buckets = list(pack_weights(named_tensors))       # learner side; at most BUCKET_BYTES each
    state = unpack_weights(buckets)                   # worker side; {name: view}

``agentrl bench sync`` times both (docs/benchmarks.md, "Weight sync"): 8.7x faster at the
Qwen2.5-0.5B shape on 2 CPU cores, 6.05x at the 1.5B shape on an H200.

When the learner and the rollout engine share a GPU (the colocated layout) no byte needs to leave
it: :func:`ipc_handles` turns the learner's weight tensors into CUDA IPC handles (a few hundred
bytes each, no copy of a weight that is a parameter itself) and :func:`open_ipc_handles` gives the
rollout worker tensors on the very same device memory, which the backend copies into its model
(``rollout.weight_sync``; docs/rollout.md). Not yet run on a GPU.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

BUCKET_BYTES = 512 * 2**20   # one bucket's size; a tensor larger than this gets a bucket of its own
ALIGN = 64                   # each tensor starts at a multiple of this, so any dtype can view its bytes


def _aligned(count: int) -> int:
    return -(-count // ALIGN) * ALIGN


@dataclass
class PackedWeights:
    """Named tensors laid out back to back in one ``uint8`` buffer.

    ``entries`` holds ``(name, dtype name, shape, byte offset, byte count)`` per tensor; offsets
    are multiples of :data:`ALIGN`.
    """

    buffer: np.ndarray
    entries: list[tuple[str, str, tuple[int, ...], int, int]] = field(default_factory=list)

    def tensors(self) -> dict[str, torch.Tensor]:
        """``{name: tensor}`` viewing the buffer (no copy; read-only when the buffer came out of
        Ray's object store, so copy before writing)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # torch warns that a read-only array is not writable
            flat = torch.from_numpy(self.buffer)
        return {name: flat[offset:offset + count].view(getattr(torch, dtype)).view(shape)
                for name, dtype, shape, offset, count in self.entries}


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)


def pack_weights(named_tensors: Iterable[tuple[str, torch.Tensor]],
                 bucket_bytes: int = BUCKET_BYTES) -> Iterator[PackedWeights]:
    """Copy ``(name, tensor)`` pairs (any device) into buckets of at most ``bucket_bytes`` (a
    larger tensor gets a bucket of its own), in order.

    Each tensor is copied into its bucket as soon as the iterable yields it, before the next one
    is asked for: a generator may yield views that are only valid until then (a ZeRO-3 parameter
    inside its gather), and no more than one bucket is held on the host at a time.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buffer: np.ndarray | None = None
    flat = torch.empty(0, dtype=torch.uint8)
    entries: list[tuple[str, str, tuple[int, ...], int, int]] = []
    offset = 0
    for name, tensor in named_tensors:
        count = tensor.numel() * tensor.element_size()
        if buffer is not None and offset + count > len(buffer):
            yield PackedWeights(buffer[:offset], entries)
            buffer = None
        if buffer is None:
            # np.empty only reserves the pages: the bytes not written are never touched nor sent
            buffer, entries, offset = np.empty(max(bucket_bytes, count), dtype=np.uint8), [], 0
            flat = torch.from_numpy(buffer)
        flat[offset:offset + count].copy_(_byte_view(tensor))
        entries.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, count))
        offset += _aligned(count)
    if buffer is not None:
        yield PackedWeights(buffer[:offset], entries)


def unpack_weights(buckets: Sequence[PackedWeights]) -> dict[str, torch.Tensor]:
    """One ``{name: tensor}`` dict over all buckets; a name packed twice is an error."""
    state: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        for name, tensor in bucket.tensors().items():
            if name in state:
                raise ValueError(f"weight {name!r} is in more than one bucket")
            state[name] = tensor
    return state


def as_buckets(weights: Mapping[str, torch.Tensor] | Sequence[PackedWeights],
               bucket_bytes: int = BUCKET_BYTES) -> Iterator[PackedWeights]:
    """Packed buckets from a ``{name: tensor}`` state dict, or the buckets themselves."""
    if isinstance(weights, Mapping):
        return pack_weights(weights.items(), bucket_bytes)
    return iter(weights)


@dataclass
class IpcWeights:
    """CUDA IPC handles of named tensors on one GPU (``device_uuid``), from
    ``torch.multiprocessing.reductions.reduce_tensor``. The sender keeps the tensors alive until
    the receiver has copied them."""

    device_uuid: str
    handles: list[tuple[str, tuple]] = field(default_factory=list)


def device_uuid(index: int | None = None) -> str:
    """The UUID of a CUDA device (the same GPU has the same UUID in every process, whatever its index)."""
    index = torch.cuda.current_device() if index is None else index
    return str(torch.cuda.get_device_properties(index).uuid)


def ipc_handles(named_tensors: Iterable[tuple[str, torch.Tensor]], keep: list[torch.Tensor]) -> IpcWeights:
    """Handles of ``(name, CUDA tensor)`` pairs; every tensor handed out is appended to ``keep``
    (contiguous ones as they are, others as a contiguous copy), which must outlive the receiver's copy."""
    from torch.multiprocessing.reductions import reduce_tensor

    weights = IpcWeights(device_uuid())
    for name, tensor in named_tensors:
        tensor = tensor.detach()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        keep.append(tensor)
        weights.handles.append((name, tuple(reduce_tensor(tensor)[1])))
    return weights


def local_device_index(uuid: str) -> int:
    """This process's index of the GPU with ``uuid``; ValueError when it does not see that GPU."""
    for index in range(torch.cuda.device_count()):
        if device_uuid(index) == uuid:
            return index
    raise ValueError(f"this process does not see GPU {uuid}: CUDA IPC needs the learner and the rollout engine on "
                     "the same GPU (rollout.weight_sync=packed works across GPUs and nodes)")


def open_ipc_handles(weights: IpcWeights) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` on the sender's memory (read them before the sender frees them)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    index = local_device_index(weights.device_uuid)
    state = {}
    for name, args in weights.handles:
        args = list(args)
        args[6] = index             # the storage's device: this process's index of the same GPU
        state[name] = rebuild_cuda_tensor(*args)
    return state


__all__ = ["BUCKET_BYTES", "IpcWeights", "PackedWeights", "as_buckets", "device_uuid", "ipc_handles",
           "local_device_index", "open_ipc_handles", "pack_weights", "unpack_weights"]
