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

Across GPUs (and nodes), :class:`WeightBroadcast` is a process group of its own between the
learner's rank 0 and the rollout workers (NCCL on GPUs, gloo on CPU; the learner's training group is
untouched): rank 0 packs the weights into device buckets laid out once (:func:`broadcast_layout`)
and broadcasts them, each worker receives them straight into its device memory.
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


def pick_handle_set(handle_sets: Sequence[IpcWeights], own_uuid: str | None,
                    visible_uuids: Iterable[str]) -> IpcWeights:
    """The set of handles a rank opens: the one on its own GPU, else one on a GPU it sees (same node)."""
    visible = set(visible_uuids)
    for weights in handle_sets:
        if weights.device_uuid == own_uuid:
            return weights
    for weights in handle_sets:
        if weights.device_uuid in visible:
            return weights
    raise ValueError(f"no CUDA IPC handles for a GPU this rank sees (its GPU {own_uuid}; handles for "
                     f"{[w.device_uuid for w in handle_sets]}): set rollout.weight_sync=packed for this layout")


@dataclass(frozen=True)
class BroadcastLayout:
    """Where every weight sits in the broadcast buckets: fixed for a model, so computed once and
    sent to the workers with each sync (``entries`` per bucket as in :class:`PackedWeights`)."""

    buckets: tuple[tuple[tuple[str, str, tuple[int, ...], int, int], ...], ...]
    sizes: tuple[int, ...]


def broadcast_layout(named_tensors: Iterable[tuple[str, torch.Tensor]],
                     bucket_bytes: int = BUCKET_BYTES) -> BroadcastLayout:
    """The bucket layout of ``(name, tensor)`` pairs (only their dtypes and shapes are read)."""
    buckets, sizes, entries, offset = [], [], [], 0
    for name, tensor in named_tensors:
        count = tensor.numel() * tensor.element_size()
        if entries and offset + count > bucket_bytes:
            buckets.append(tuple(entries))
            sizes.append(offset)
            entries, offset = [], 0
        entries.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, count))
        offset += _aligned(count)
    if entries:
        buckets.append(tuple(entries))
        sizes.append(offset)
    return BroadcastLayout(tuple(buckets), tuple(sizes))


class WeightBroadcast:
    """One process group between the learner's rank 0 (rank 0) and the rollout workers (ranks 1..W).

    Built with its own ``TCPStore`` at ``host:port`` (rank 0 serves it: the one
    :func:`agentrl.runtime.rendezvous.reserve_store` bound in its process, if any), so it lives beside the
    learner's training group; every member must construct it at about the same time (each waits
    for the others up to ``timeout_s``). NCCL when ``device`` is ``cuda``, gloo otherwise.
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int, device: str, timeout_s: float = 600.0):
        import datetime

        import torch.distributed as dist

        from agentrl.runtime.rendezvous import store_at

        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        store = store_at(host, port, world_size, rank == 0, datetime.timedelta(seconds=timeout_s))
        self.group = (dist.ProcessGroupNCCL(store, rank, world_size) if device == "cuda" else
                      dist.ProcessGroupGloo(store, rank, world_size))
        self._options = dist.BroadcastOptions()
        self._options.rootRank = 0

    def _broadcast(self, buffer: torch.Tensor) -> None:
        self.group.broadcast([buffer], self._options).wait()

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], layout: BroadcastLayout) -> int:
        """Rank 0: broadcast the weights bucket by bucket (the order of ``layout``); the bytes sent."""
        expected = iter([entry for bucket in layout.buckets for entry in bucket])
        bucket_index, buffer, sent = 0, None, 0
        for name, tensor in named_tensors:
            entry = next(expected, None)
            if entry is None or entry[0] != name:
                raise ValueError(f"weight {name!r} is not where the broadcast layout has {entry and entry[0]!r}")
            if buffer is None:
                buffer = torch.empty(layout.sizes[bucket_index], dtype=torch.uint8, device=self.device)
            _, _, _, offset, count = entry
            buffer[offset:offset + count].copy_(_byte_view(tensor.to(self.device)))
            if entry == layout.buckets[bucket_index][-1]:
                self._broadcast(buffer)
                sent += buffer.numel()
                bucket_index, buffer = bucket_index + 1, None
        if bucket_index != len(layout.buckets):
            raise ValueError(f"{len(layout.buckets) - bucket_index} bucket(s) of the layout got no weights")
        return sent

    def receive(self, layout: BroadcastLayout) -> dict[str, torch.Tensor]:
        """Ranks 1..W: ``{name: tensor}`` on this member's device (views into the received buckets)."""
        state = {}
        for entries, size in zip(layout.buckets, layout.sizes):
            buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
            self._broadcast(buffer)
            for name, dtype, shape, offset, count in entries:
                state[name] = buffer[offset:offset + count].view(getattr(torch, dtype)).view(shape)
        return state


__all__ = ["BUCKET_BYTES", "BroadcastLayout", "IpcWeights", "WeightBroadcast", "broadcast_layout", "PackedWeights", "as_buckets", "device_uuid", "ipc_handles",
           "local_device_index", "open_ipc_handles", "pack_weights", "pick_handle_set", "unpack_weights"]
