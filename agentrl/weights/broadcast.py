"""``rollout.weight_sync=broadcast``: a process group of the learner's rank 0 and the rollout
workers (NCCL on GPUs, gloo on CPU), received straight into each worker's device memory, during a
rollout too.

:class:`WeightBroadcast` is a process group of its own (the learner's training group is untouched):
rank 0 packs the weights into device buckets laid out once (:func:`broadcast_layout`) and
broadcasts them, each worker receives them straight into its device memory.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Iterable

import ray
import torch
import torch.distributed as dist

from agentrl.runtime.rendezvous import reserve_store, store_at
from agentrl.weights.base import BUCKET_BYTES, WEIGHT_PATHS, WeightPath, aligned, backend_refusal, byte_view, first


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
        offset += aligned(count)
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
            buffer[offset:offset + count].copy_(byte_view(tensor.to(self.device)))
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


def node_address() -> str:
    """This process's node address as the other members reach it (loopback without Ray)."""
    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


@WEIGHT_PATHS.register
class BroadcastPath(WeightPath):
    """Rank 0 serves the group's store and broadcasts; the workers join as ranks 1..W and receive."""

    name = "broadcast"
    preference = 1

    class Sender:
        def __init__(self, learner: Any):
            self.learner = learner
            self.group: WeightBroadcast | None = None

        def serve(self, world_size: int) -> tuple[str, int] | None:
            """Rank 0: its node's address and the port of the group's store, bound now in its process."""
            return (node_address(), reserve_store(world_size)) if self.learner.is_main else None

        def layout(self, bucket_bytes: int = BUCKET_BYTES) -> BroadcastLayout | None:
            """Where each weight sits in the buckets (rank 0; collective under ZeRO-3)."""
            layout = broadcast_layout(self.learner.rollout_weights(), bucket_bytes)
            return layout if self.learner.is_main else None

        def join(self, host: str, port: int, world_size: int) -> None:
            """Rank 0 joins the group as its rank 0 (blocks until every worker has joined too)."""
            if self.learner.is_main:
                self.group = WeightBroadcast(host, port, 0, world_size, self.learner.device)

        def send(self, layout: BroadcastLayout) -> int:
            """Rank 0 broadcasts (every rank runs it: ZeRO-3 gathers); the bytes sent."""
            if self.learner.is_main:
                return self.group.send(self.learner.rollout_weights(), layout)
            for _ in self.learner.rollout_weights():
                pass
            return 0

    class Receiver:
        def __init__(self, worker: Any):
            self.worker = worker
            self.group: WeightBroadcast | None = None

        def join(self, host: str, port: int, rank: int, world_size: int) -> None:
            self.group = WeightBroadcast(host, port, rank, world_size,
                                         "cuda" if self.worker.device.startswith("cuda") else "cpu")

        def receive(self, layout: BroadcastLayout, version: int | None = None) -> None:
            """One broadcast, straight into this worker's device, loaded now or at the next step boundary."""
            self.worker.take_weights(self.group.receive(layout), version)

    @classmethod
    def refusal(cls, layout) -> str | None:
        if layout.on_gpu and (layout.colocated or layout.rank0_shares_a_gpu):
            return ("needs the learner's rank 0 and every rollout GPU apart (NCCL refuses two members on one GPU), "
                    "but this layout shares them; set rollout.weight_sync=auto (or packed), or placement.layout=split")
        return backend_refusal(cls.name, layout)

    @classmethod
    def auto_applies(cls, layout) -> bool:
        return layout.on_gpu and cls.refusal(layout) is None     # on CPU packed is faster (docs/benchmarks.md)

    def __init__(self, learner: Any, rollout: Any):
        super().__init__(learner, rollout)
        self.layout: BroadcastLayout | None = None

    def connect(self) -> None:
        """The learner's rank 0 and the workers form one group, once (rank 0 serves its store)."""
        members = self.rollout.num_workers + 1
        host, port = first(self.learner.weights_call(self.Sender, "serve", members))
        self.layout = first(self.learner.weights_call(self.Sender, "layout"))
        joining = self.rollout.weights_call_each(self.Receiver, "join",
                                                 [(host, port, i + 1, members) for i in range(self.rollout.num_workers)])
        self.learner.weights_call(self.Sender, "join", host, port, members)
        self.rollout.wait(joining)

    def send(self, version: int) -> None:
        receiving = self.rollout.weights_call(self.Receiver, "receive", self.layout, version=version)
        self.learner.weights_call(self.Sender, "send", self.layout)
        self.rollout.wait(receiving)


__all__ = ["BroadcastLayout", "BroadcastPath", "WeightBroadcast", "broadcast_layout"]
