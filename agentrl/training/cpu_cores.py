"""CPU cores of a one-rank learner that runs in the trainer's process (``learner.torch_threads``).

In ``trainer.mode=sync`` each phase has every core while it runs. When the rollout runs at the same
time as the learner (one_step_off, async) the cores are shared: the learner gets one share of
``rollout.num_workers + 1``, and borrows the rollout's share while no rollout work runs (it asks
before each micro-batch). A fixed ``learner.torch_threads=n`` turns both off.
"""

from __future__ import annotations

from typing import Callable

from agentrl.config import Config
from agentrl.config.modes import training_mode
from agentrl.rollout.workers import available_cores as cores
from agentrl.runtime.denormals import warn_unless_flushed


def available_cores() -> int:
    return cores()


def prepare_local_learner(cfg: Config, device: str) -> bool:
    """A one-rank learner on CPU runs in this process: warn when its floats are not flushed (the agentrl
    command flushes them; Ray learner ranks flush their own, agentrl.runtime.denormals) and set its
    threads. True when the learner runs here on CPU."""
    if device != "cpu" or cfg.learner.num_ranks != 1:
        return False
    warn_unless_flushed()
    if learner_threads(cfg):
        import torch

        torch.set_num_threads(learner_threads(cfg))
    return True


def learner_threads(cfg: Config) -> int | None:
    """The learner's threads: ``learner.torch_threads`` when set; None (torch's default) when the
    rollout never runs at the same time; else its share of the cores."""
    if cfg.learner.torch_threads:
        return cfg.learner.torch_threads
    shares = rollout_thread_shares(cfg)
    return None if shares is None else max(1, available_cores() // shares)


def rollout_thread_shares(cfg: Config) -> int | None:
    """What ``rollout.torch_threads=0`` divides the cores by: None (the workers) when the learner never
    runs at the same time, else the workers and the learner."""
    return training_mode(cfg.trainer.mode).cpu_shares(cfg.rollout.num_workers)


def core_policy(cfg: Config, rollout_busy: Callable[[], bool]) -> Callable[[], int] | None:
    """What the learner asks before each micro-batch: its share while the rollout is busy, every core
    while it is not; None when nothing is lent (a fixed thread count, or no cores to lend)."""
    share, every = learner_threads(cfg), available_cores()
    if cfg.learner.torch_threads or share is None or every <= share:
        return None
    return lambda: share if rollout_busy() else every


__all__ = ["core_policy", "learner_threads", "prepare_local_learner", "rollout_thread_shares"]
