"""How new weights reach the rollout workers: one component, chosen once per run.

    sync = weight_sync_for(cfg, learner, rollout)     # packed, ipc or broadcast (rollout.weight_sync)
    sync.connect()                                   # once: the broadcast group is formed here
    sync.push(version)                               # after each update: every worker has ``version``

The learner (:class:`~agentrl.learner.group.LearnerGroup`) sends and the rollout workers
(:class:`~agentrl.rollout.workers.RolloutWorkerGroup`) receive; neither knows the other. The three
paths, with the primitives in :mod:`agentrl.weights.transfer`:

* ``packed``: flat byte buckets through host memory and Ray's object store (every layout; the
  only one on CPU);
* ``ipc``: CUDA IPC handles of the learner's tensors, copied device to device by a worker on the
  same GPU (one learner rank with ZeRO <= 2, the rollout between rollouts only);
* ``broadcast``: a process group of the learner's rank 0 and the workers (NCCL on GPUs, gloo on
  CPU), received straight into each worker's device memory, during a rollout too.
"""

from __future__ import annotations

from typing import Any

from agentrl.config import Config
from agentrl.errors import UsageError


def weight_sync_path(cfg: Config, learner_device: str, learner_gpu: str | None,
                     rollout_gpus: list[str | None], colocated: bool = False) -> str:
    """``ipc`` when ``rollout.weight_sync`` asks for it or, with ``auto``, when it applies: one learner
    rank on a GPU with ZeRO <= 2 and every rollout worker on that same GPU (``*_gpu``: device UUIDs).
    ``auto`` otherwise: ``broadcast`` on GPUs, ``packed`` on CPU. ``broadcast`` and ``packed`` as asked.
    ``colocated`` (the placement plan's layout): learner ranks share the engines' GPUs, and NCCL refuses
    a group with two members on one GPU, so ``auto`` takes ``packed`` there and ``broadcast`` is refused."""
    applies = (learner_device == "cuda" and cfg.learner.num_ranks == 1 and cfg.learner.zero_stage < 3
               and learner_gpu is not None and bool(rollout_gpus) and all(g == learner_gpu for g in rollout_gpus))
    wanted = cfg.rollout.weight_sync
    if wanted == "ipc" and not applies:
        raise UsageError("rollout.weight_sync=ipc needs one learner rank (learner.num_ranks=1) on a GPU with "
                         "learner.zero_stage <= 2 and every rollout worker on the learner's GPU; set "
                         "rollout.weight_sync=auto (or packed) for this layout")
    if wanted == "broadcast" and colocated and learner_device == "cuda":
        raise UsageError("rollout.weight_sync=broadcast needs the learner's rank 0 and every rollout worker on GPUs of "
                         "their own (NCCL refuses two members on one GPU), but placement.layout=colocated shares them; "
                         "set rollout.weight_sync=auto (or packed), or placement.layout=split")
    if wanted != "auto":
        return wanted
    return "ipc" if applies else "packed" if colocated or learner_device != "cuda" else "broadcast"


class WeightSync:
    """The learner's weights into every rollout worker, as a policy version."""

    name = ""
    #: whether :meth:`push` may run while a rollout call runs (the workers load at a step boundary)
    during_rollout = True

    def __init__(self, learner: Any, rollout: Any):
        self.learner, self.rollout = learner, rollout

    def connect(self) -> None:
        """Whatever the path sets up once, before the first push."""

    def push(self, version: int) -> None:
        raise NotImplementedError


class PackedSync(WeightSync):
    name = "packed"

    def push(self, version: int) -> None:
        self.rollout.load_weights(self.learner.packed_weights_for_rollout(), version=version)


class IpcSync(WeightSync):
    name = "ipc"
    during_rollout = False      # the learner reuses the memory behind the handles once the push returns

    def push(self, version: int) -> None:
        self.rollout.load_weights_ipc(self.learner.ipc_weights_for_rollout(), version=version)
        self.learner.release_ipc_weights()


class BroadcastSync(WeightSync):
    name = "broadcast"

    def __init__(self, learner: Any, rollout: Any):
        super().__init__(learner, rollout)
        self.layout = None

    def connect(self) -> None:
        """The learner's rank 0 and the workers form one group, once (rank 0 serves its store)."""
        members = self.rollout.num_workers + 1
        host, port = self.learner.weight_broadcast_address(members)
        self.layout = self.learner.weight_broadcast_layout()
        joining = self.rollout.join_weight_broadcast(host, port)
        self.learner.join_weight_broadcast(host, port, members)
        self.rollout.wait(joining)

    def push(self, version: int) -> None:
        receiving = self.rollout.receive_weights(self.layout, version=version)
        self.learner.broadcast_weights(self.layout)
        self.rollout.wait(receiving)


PATHS = {cls.name: cls for cls in (PackedSync, IpcSync, BroadcastSync)}


def weight_sync_for(cfg: Config, learner: Any, rollout: Any, device: str, colocated: bool = False) -> WeightSync:
    """The path ``rollout.weight_sync`` asks for (or ``auto`` picks for this layout), not yet connected."""
    if device == "cuda":
        from agentrl.weights import device_uuid

        path = weight_sync_path(cfg, device, device_uuid(), rollout.gpu_uuids(), colocated)
    else:
        path = weight_sync_path(cfg, device, None, [])
    return PATHS[path](learner, rollout)


__all__ = ["BroadcastSync", "IpcSync", "PackedSync", "WeightSync", "weight_sync_for", "weight_sync_path"]
