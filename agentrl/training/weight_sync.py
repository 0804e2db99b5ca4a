"""How new weights reach the rollout workers: one weight path, chosen once per run.

    sync = weight_sync_for(cfg, learner, rollout, device)   # rollout.weight_sync: packed, ipc, broadcast, auto
    sync.connect()                                          # once: the broadcast group is formed here
    sync.push(version)                                      # after each update: every worker has ``version``

The paths are components of :mod:`agentrl.weights` (a sender in the learner ranks, a receiver in the
rollout workers, the path in this process); the learner group and the rollout worker group only fan
their calls out, so neither knows the other nor any path. This module describes the run's layout to
them (:class:`~agentrl.weights.SyncLayout`) and builds the one ``rollout.weight_sync`` asks for, or the
one ``auto`` picks.
"""

from __future__ import annotations

from typing import Any, Sequence

from agentrl.config import Config
from agentrl.weights import SyncLayout, WeightPath, choose_path


def sync_layout(cfg: Config, learner_device: str, learner_gpus: Sequence[str] = (), rollout_gpus: Sequence[str] = (),
                colocated: bool = False, backend_paths: Sequence[str] | None = None) -> SyncLayout:
    """The layout a path is chosen for (``*_gpus``: device UUIDs, one per learner rank and one per GPU of
    each rollout engine, its tensor-parallel ranks; empty on CPU)."""
    return SyncLayout(device=learner_device, learner_gpus=tuple(learner_gpus), rollout_gpus=tuple(rollout_gpus),
                      colocated=colocated, zero_stage=cfg.learner.zero_stage,
                      backend_paths=None if backend_paths is None else tuple(backend_paths))


def weight_sync_path(cfg: Config, learner_device: str, learner_gpus: Sequence[str] = (),
                     rollout_gpus: Sequence[str] = (), colocated: bool = False) -> str:
    """The name of the path ``rollout.weight_sync`` gives for this layout (refused in one line where it
    cannot run): ``auto`` is ``ipc`` where it applies, else ``broadcast`` on GPUs where it can run, else
    ``packed`` (always on CPU)."""
    return choose_path(cfg.rollout.weight_sync, sync_layout(cfg, learner_device, learner_gpus, rollout_gpus,
                                                            colocated)).name


def weight_sync_for(cfg: Config, learner: Any, rollout: Any, device: str, colocated: bool = False,
                    backend_paths: Sequence[str] | None = None) -> WeightPath:
    """The path ``rollout.weight_sync`` asks for (or ``auto`` picks for this layout), not yet connected;
    ``backend_paths``: the paths the generation back end can receive (None: every one)."""
    on_gpu = device == "cuda"
    layout = sync_layout(cfg, device, learner.gpu_uuids() if on_gpu else (), rollout.gpu_uuids() if on_gpu else (),
                         colocated, backend_paths)
    path = choose_path(cfg.rollout.weight_sync, layout)
    sync = path(learner, rollout)
    # a learner that shares its GPUs with sleeping engines hands its cached memory back before they wake
    sync.free_learner_cache = on_gpu and (colocated or path.shares_learner_memory)
    return sync


__all__ = ["sync_layout", "weight_sync_for", "weight_sync_path"]
