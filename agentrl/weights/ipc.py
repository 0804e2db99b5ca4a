"""``rollout.weight_sync=ipc``: CUDA IPC handles of the learner's weights, opened by the engine rank
on the same GPU (learner on GPUs with ZeRO <= 2, every rollout GPU holding a learner rank: the
colocated layout; between rollouts only).

When the learner and the rollout engine share a GPU no byte needs to leave it: :func:`ipc_handles`
turns the learner's weight tensors into CUDA IPC handles (a few hundred bytes each, no copy of a
weight that is a parameter itself) and :func:`open_ipc_handles` gives the rollout worker tensors on
the very same device memory, which the back end copies into its model (docs/rollout.md). Not yet
run on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from agentrl.weights.base import WEIGHT_PATHS, WeightPath, backend_refusal, device_uuid


@dataclass
class IpcWeights:
    """CUDA IPC handles of named tensors on one GPU (``device_uuid``), from
    ``torch.multiprocessing.reductions.reduce_tensor``. The sender keeps the tensors alive until
    the receiver has copied them."""

    device_uuid: str
    handles: list[tuple[str, tuple]] = field(default_factory=list)


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


@WEIGHT_PATHS.register
class IpcPath(WeightPath):
    """Every rank hands out handles on its GPU; each engine rank copies from the learner rank on its own GPU."""

    name = "ipc"
    preference = 0
    during_rollout = False      # the learner reuses the memory behind the handles once the push returns
    shares_learner_memory = True

    class Sender:
        def __init__(self, learner: Any):
            self.learner = learner
            self.kept: list[torch.Tensor] = []

        def handles(self) -> IpcWeights:
            """Handles of this rank's weights on its GPU (ZeRO <= 2: every rank holds the whole model): a
            weight that is a parameter itself is shared, not copied; merged LoRA weights are fresh
            tensors. They stay alive until :meth:`release`, after the rollout workers copied them."""
            if self.learner.device != "cuda" or self.learner.zero_stage == 3:
                raise RuntimeError("CUDA IPC weight sync needs the learner on GPUs with ZeRO <= 2 (ZeRO-3 "
                                   "gathers each parameter only for a moment)")
            self.kept = []
            return ipc_handles(self.learner.rollout_weights(every_rank=True), self.kept)

        def release(self) -> None:
            torch.cuda.synchronize()
            self.kept = []

    class Receiver:
        def __init__(self, worker: Any):
            self.worker = worker

        def load(self, handle_sets: Sequence[IpcWeights], version: int | None = None) -> None:
            """The back end copies the weights device to device, each GPU of the engine from the
            learner rank on it; refused while a rollout runs (the handles cannot wait)."""
            self.worker.load_between_rollouts(lambda: self.worker.backend.load_weights_ipc(list(handle_sets)),
                                              version, why="CUDA IPC weights cannot wait for a step boundary")

    @classmethod
    def refusal(cls, layout) -> str | None:
        if not (layout.on_gpu and layout.zero_stage < 3 and layout.learner_gpus and layout.rollout_gpus
                and set(layout.rollout_gpus) <= set(layout.learner_gpus)):
            return ("needs the learner on GPUs with learner.zero_stage <= 2 and every rollout GPU holding a learner "
                    "rank (placement.layout=colocated); set rollout.weight_sync=auto (or packed) for this layout")
        return backend_refusal(cls.name, layout)

    def send(self, version: int) -> None:
        handle_sets = self.learner.weights_call(self.Sender, "handles")
        self.rollout.wait(self.rollout.weights_call(self.Receiver, "load", handle_sets, version=version))
        self.learner.weights_call(self.Sender, "release")


__all__ = ["IpcPath", "IpcWeights", "ipc_handles", "local_device_index", "open_ipc_handles", "pick_handle_set"]
