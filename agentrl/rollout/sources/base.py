"""The interface every training mode's rollout source implements, and what it hands the trainer.

The trainer asks every source the same things (docs/async.md)::

    source.start(done, saved)            # after a resume: the checkpoint's buffer, calls/groups re-run
    taken = source.next_batch(k)         # tasks_per_iteration whole groups for iteration k + metrics
    source.sleep()                       # colocated: the engine's accelerator memory to the learner
    ... learner ...
    source.before_push()                 # one_step_off: the call in flight finishes on its weights
    weights.push(k)
    source.wait_for_next()               # before a checkpoint, where the source can
    source.save(checkpoint_dir)          # the buffer and what was in flight
    with source.paused(): validate(...)  # the rollout workers to themselves

A source is built by ``from_config(cfg, workers, tasks_of)``; the training mode that uses it names it
(:attr:`agentrl.config.modes.TrainingMode.source`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from agentrl.rollout.engine import RolloutResult


@dataclass
class Taken:
    """One iteration's groups and what the source measured while providing them."""

    result: RolloutResult
    metrics: dict[str, float] = field(default_factory=dict)


class RolloutSource:
    """The interface every mode's source implements (see the module docstring)."""

    #: how many policy versions a trained group may be behind the learner
    max_staleness = 0

    @classmethod
    def from_config(cls, cfg, workers, tasks_of) -> "RolloutSource":
        """The source over ``workers`` (:class:`~agentrl.rollout.workers.RolloutWorkerGroup`) for the run
        ``cfg`` describes; ``tasks_of(i)``: iteration i's tasks (:class:`~agentrl.runs.task_schedule.TaskSchedule`)."""
        raise NotImplementedError(f"{cls.__name__} does not define from_config(cfg, workers, tasks_of)")

    def start(self, done: int, saved: Path | None) -> str | None:
        """Begin after ``done`` finished iterations; ``saved``: that checkpoint's rollout buffer, if any.
        A line for the run's status when something was restored."""
        return None

    def next_batch(self, iteration: int) -> Taken:
        raise NotImplementedError

    def sleep(self) -> None:
        """The rollout frees its accelerator memory for the learner's passes until the next weight push
        (a colocated layout, ``rollout.vllm.sleep_level``; the overlapped modes never sleep)."""

    def before_push(self) -> None:
        """Called after the update, before the new weights go to the workers."""

    def busy(self) -> bool:
        """Whether rollout work runs now (the learner lends itself the rollout's cores when not)."""
        return False

    def wait_for_next(self) -> None:
        """Before a checkpoint: let the next iteration's groups arrive, when the source can, so that a
        resumed run trains exactly what this one would."""

    def save(self, directory: Path) -> None:
        """Checkpoint state into ``directory``: the groups buffered and what was in flight."""

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The rollout workers free for other calls (validation) inside the block."""
        yield

    def close(self) -> None:
        """Stop what runs (the run is over or failed)."""


def rollout_seed(seed: int, iteration: int) -> int:
    """The sampling seed of iteration ``iteration``'s rollout (of rollout call ``iteration``)."""
    return seed * 1_000_003 + iteration



__all__ = ["RolloutSource", "Taken", "rollout_seed"]
