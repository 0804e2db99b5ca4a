"""Process-group setup for the learner ranks, and the few collectives the learner needs.

Every rank reads its place from the usual variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``); a single process without them is rank 0 of 1 on a free local
port. The backend is gloo on CPU and NCCL on GPU.

Rank 0's rendezvous store is bound when its port is chosen and held until the group is built
(:mod:`agentrl.runtime.rendezvous`); a port the user sets is used as it is.

DeepSpeed's CPU accelerator builds a shared-memory all-reduce extension (``deepspeed_shm_comm``)
with a C++ JIT compile the first time a process group is created (about 40 s on a fresh machine).
The learner's collectives are few and small, so by default that extension is switched off and
gloo does the work; ``learner.cpu_shm_comm=true`` turns it back on.

The group's timeout is ``learner.collective_timeout_s`` (not DeepSpeed's 30 minutes): a rank that
waits that long in a collective for a peer raises (gloo; NCCL's watchdog ends the process), and the
trainer names the rank that did not come (:mod:`agentrl.learner.rank_calls`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from agentrl.runtime.rendezvous import holds_store, reserve_store, store_at

SHM_COMM_OP = "deepspeed_shm_comm"


@dataclasses.dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_chosen_ports: set[int] = set()     # MASTER_PORTs this process chose (not the user's)


def rank_from_env() -> RankInfo:
    """This process's rank; fills in single-process defaults for the variables that are missing
    (``MASTER_PORT``: a store reserved now)."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        # a port this process chose whose store a finished group used: a later learner needs a new one
        port_text = os.environ.get("MASTER_PORT")
        used = port_text is not None and int(port_text) in _chosen_ports and not holds_store(int(port_text)) \
            and not dist.is_initialized()
        if port_text is None or used:
            port = reserve_store(1)
            _chosen_ports.add(port)
            os.environ["MASTER_PORT"] = str(port)
    missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {', '.join(missing)} not set: "
                           "start the learner ranks through LearnerGroup or a distributed launcher")
    return RankInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))


def init_process_group(device: str, cpu_shm_comm: bool = False, timeout_s: Optional[float] = None) -> RankInfo:
    """Create (once per process) the default process group through DeepSpeed; ``timeout_s``: how long
    a collective (and the rendezvous) waits for the other ranks (None: DeepSpeed's default, 30 min)."""
    import deepspeed
    import deepspeed.ops

    info = rank_from_env()
    if dist.is_initialized():
        if dist.get_world_size() != info.world_size:
            raise RuntimeError(f"a process group of size {dist.get_world_size()} exists, WORLD_SIZE={info.world_size}")
        return info
    if device == "cpu" and not cpu_shm_comm:
        deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
    if device.startswith("cuda"):
        torch.cuda.set_device(info.local_rank)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    # torch's group over our store (rank 0's may be held since its port was chosen); DeepSpeed then
    # wraps the existing group
    from deepspeed.constants import default_pg_timeout

    timeout = default_pg_timeout if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    store = store_at(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size,
                     info.rank == 0, timeout)
    dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.world_size, timeout=timeout)
    deepspeed.init_distributed(dist_backend=backend, verbose=False)
    return info


def destroy_process_group() -> None:
    """Tear this process's process group down at the end of a run: NCCL frees its communicators
    (torch warns at exit when a group was never destroyed), and a later learner in the same
    process creates a fresh group."""
    import deepspeed.comm

    if dist.is_initialized():
        deepspeed.comm.destroy_process_group()


def _device_of_group() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_values(values: Sequence[float], op: str = "sum") -> list[float]:
    """Reduce a few floats over all ranks (``sum``, ``max`` or ``min``); a no-op on one rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [float(v) for v in values]
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device_of_group())
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    dist.all_reduce(tensor, op=ops[op])
    return tensor.cpu().tolist()


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
