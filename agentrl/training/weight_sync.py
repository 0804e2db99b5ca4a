"""How new weights reach the rollout workers: one component, chosen once per run.

    sync = weight_sync_for(cfg, learner, rollout)     # packed, ipc or broadcast (rollout.weight_sync)
    sync.connect()                                   # once: the broadcast group is formed here
    sync.push(version)                               # after each update: every worker has ``version``

The learner (:class:`~agentrl.learner.group.LearnerGroup`) sends and the rollout workers
(:class:`~agentrl.rollout.workers.RolloutWorkerGroup`) receive; neither knows the other. The three
paths, with the primitives in :mod:`agentrl.weights.transfer`:

* ``packed``: flat byte buckets through host memory and Ray's object store (every layout; the
  only one on CPU);
* ``ipc``: CUDA IPC handles of the learner's tensors, one set per learner rank, copied device to
  device by the engine rank on the same GPU (ZeRO <= 2, colocated, between rollouts only);
* ``broadcast``: a process group of the learner's rank 0 and the workers (NCCL on GPUs, gloo on
  CPU), received straight into each worker's device memory, during a rollout too.
"""

from __future__ import annotations

from typing import Any, Sequence

from agentrl.config import Config
from agentrl.errors import UsageError


def weight_sync_path(cfg: Config, learner_device: str, learner_gpus: Sequence[str],
                     rollout_gpus: Sequence[str], colocated: bool = False) -> str:
    """The path for this layout (``*_gpus``: device UUIDs, one per learner rank and one per GPU of each
    rollout engine, its tensor-parallel ranks; empty on CPU).

    * ``ipc`` applies on GPUs with ZeRO <= 2 (every rank holds the whole model) when every rollout GPU
      holds a learner rank: each engine rank opens the handles of the learner rank on its own GPU.
    * ``broadcast`` cannot run when the learner's rank 0 shares a GPU with a rollout engine (NCCL
      refuses a group with two members on one GPU), nor in the colocated layout.
    * ``auto``: ``ipc`` where it applies, else ``broadcast`` on GPUs where it can run, else ``packed``
      (always on CPU). ``packed``, ``broadcast`` and ``ipc`` as asked, refused in one line where they
      cannot run."""
    on_gpu = learner_device == "cuda"
    applies = (on_gpu and cfg.learner.zero_stage < 3 and bool(learner_gpus) and bool(rollout_gpus)
               and set(rollout_gpus) <= set(learner_gpus))
    rank0_shares = on_gpu and bool(learner_gpus) and learner_gpus[0] in set(rollout_gpus)
    wanted = cfg.rollout.weight_sync
    if wanted == "ipc" and not applies:
        raise UsageError("rollout.weight_sync=ipc needs the learner on GPUs with learner.zero_stage <= 2 and every "
                         "rollout GPU holding a learner rank (placement.layout=colocated); set "
                         "rollout.weight_sync=auto (or packed) for this layout")
    if wanted == "broadcast" and on_gpu and (colocated or rank0_shares):
        raise UsageError("rollout.weight_sync=broadcast needs the learner's rank 0 and every rollout GPU apart (NCCL "
                         "refuses two members on one GPU), but this layout shares them; set rollout.weight_sync=auto "
                         "(or packed), or placement.layout=split")
    if wanted != "auto":
        return wanted
    if applies:
        return "ipc"
    return "broadcast" if on_gpu and not (colocated or rank0_shares) else "packed"


class WeightSync:
    """The learner's weights into every rollout worker, as a policy version."""

    name = ""
    #: whether :meth:`push` may run while a rollout call runs (the workers load at a step boundary)
    during_rollout = True

    def __init__(self, learner: Any, rollout: Any):
        self.learner, self.rollout = learner, rollout
        #: empty the learner's CUDA cache before each push (the engines on its GPUs wake to load)
        self.free_learner_cache = False

    def connect(self) -> None:
        """Whatever the path sets up once, before the first push."""

    def push(self, version: int) -> None:
        """Every worker gets the learner's weights as ``version``."""
        if self.free_learner_cache:
            self.learner.free_cached_memory()
        self.send(version)

    def send(self, version: int) -> None:
        raise NotImplementedError


class PackedSync(WeightSync):
    name = "packed"

    def send(self, version: int) -> None:
        self.rollout.load_weights(self.learner.packed_weights_for_rollout(), version=version)


class IpcSync(WeightSync):
    name = "ipc"
    during_rollout = False      # the learner reuses the memory behind the handles once the push returns

    def send(self, version: int) -> None:
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

    def send(self, version: int) -> None:
        receiving = self.rollout.receive_weights(self.layout, version=version)
        self.learner.broadcast_weights(self.layout)
        self.rollout.wait(receiving)


PATHS = {cls.name: cls for cls in (PackedSync, IpcSync, BroadcastSync)}


def weight_sync_for(cfg: Config, learner: Any, rollout: Any, device: str, colocated: bool = False) -> WeightSync:
    """The path ``rollout.weight_sync`` asks for (or ``auto`` picks for this layout), not yet connected."""
    if device == "cuda":
        path = weight_sync_path(cfg, device, learner.gpu_uuids(), rollout.gpu_uuids(), colocated)
    else:
        path = weight_sync_path(cfg, device, [], [])
    sync = PATHS[path](learner, rollout)
    # a learner that shares its GPUs with sleeping engines hands its cached memory back before they wake
    sync.free_learner_cache = device == "cuda" and (colocated or path == "ipc")
    return sync


__all__ = ["BroadcastSync", "IpcSync", "PackedSync", "WeightSync", "weight_sync_for", "weight_sync_path"]
