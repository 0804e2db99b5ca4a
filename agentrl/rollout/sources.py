"""Where each iteration's groups come from: one rollout source per ``trainer.mode``.

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

* :class:`SyncRollout` (``sync``): iteration k rolls out its own tasks now; then the engine may
  sleep through the learner's passes (``rollout.vllm.sleep_level``).
* :class:`CallAheadRollout` (``one_step_off``): rollout call k+1 (iteration k+1's tasks and seed)
  runs while the learner updates on call k; weights change only between calls
  (:class:`~agentrl.rollout.stream.RolloutStream`).
* :class:`~agentrl.rollout.streaming.StreamingRollout` (``async``): every worker plays groups
  continuously and hands each back when its last episode is done; new weights reach the workers
  between env steps (and between tokens); groups older than ``trainer.max_staleness`` are dropped,
  groups without signal filtered (``trainer.filter_groups``), and the stream refills both.
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


class SyncRollout(RolloutSource):
    """``trainer.mode=sync``: iteration k's rollout, now, on the weights of iteration k - 1."""

    def __init__(self, workers, tasks_of, seed_of, group_size: int, expert_guidance: bool = False):
        self.workers, self.tasks_of, self.seed_of = workers, tasks_of, seed_of
        self.group_size, self.expert_guidance = group_size, expert_guidance

    def next_batch(self, iteration: int) -> Taken:
        return Taken(self.workers.run(self.tasks_of(iteration), self.group_size, seed=self.seed_of(iteration),
                                      expert_guidance=self.expert_guidance))

    def sleep(self) -> None:
        self.workers.sleep()


class CallAheadRollout(RolloutSource):
    """``trainer.mode=one_step_off``: numbered rollout calls, one iteration ahead of the learner."""

    max_staleness = 1

    def __init__(self, workers, tasks_of, seed_of, group_size: int, tasks_per_iteration: int, iterations: int,
                 expert_guidance: bool = False):
        from agentrl.rollout.stream import RolloutStream

        self.iterations, self.tasks_per_iteration = iterations, tasks_per_iteration
        self.stream = RolloutStream(workers, tasks_of, seed_of, group_size, tasks_per_iteration,
                                    expert_guidance=expert_guidance)

    def start(self, done: int, saved: Path | None) -> str | None:
        self.stream.next_call = done + 1
        if saved is None or not saved.is_dir():
            return None
        groups = self.stream.restore(saved)
        return (f"restored {groups} buffered groups; {self.stream.resubmitted} rollout calls that were in flight "
                "run again")

    def next_batch(self, iteration: int) -> Taken:
        needed = (self.iterations - iteration + 1) * self.tasks_per_iteration
        self.stream.submit_until(iteration + self.max_staleness, needed)
        taken = self.stream.next_batch(iteration - 1, self.max_staleness)
        return Taken(taken.result, taken.metrics())

    def before_push(self) -> None:
        # the call in flight finishes on the weights it began with: one policy version per call
        self.stream.wait_for_all()

    def busy(self) -> bool:
        return self.stream.running()

    def wait_for_next(self) -> None:
        self.stream.wait_for_call(self.stream.next_call - 1)

    def save(self, directory: Path) -> None:
        self.stream.save(directory)

    def close(self) -> None:
        self.stream.cancel()


def rollout_seed(seed: int, iteration: int) -> int:
    """The sampling seed of iteration ``iteration``'s rollout (of rollout call ``iteration``)."""
    return seed * 1_000_003 + iteration


def rollout_source(cfg, workers, tasks_of) -> RolloutSource:
    """The source of ``trainer.mode`` over ``workers`` (:class:`~agentrl.rollout.workers.RolloutWorkerGroup`);
    ``tasks_of(i)``: iteration i's tasks (:class:`~agentrl.runs.task_schedule.TaskSchedule`)."""
    mode, env = cfg.trainer.mode, cfg.env

    def seed_of(iteration: int) -> int:
        return rollout_seed(cfg.trainer.seed, iteration)

    if mode == "sync":
        return SyncRollout(workers, tasks_of, seed_of, env.group_size, cfg.rollout.expert_guidance)
    if mode == "one_step_off":
        return CallAheadRollout(workers, tasks_of, seed_of, env.group_size, env.tasks_per_iteration,
                                cfg.trainer.iterations, cfg.rollout.expert_guidance)
    from agentrl.rollout.streaming import StreamingRollout

    return StreamingRollout(workers, tasks_of, cfg)


__all__ = ["CallAheadRollout", "RolloutSource", "SyncRollout", "Taken", "rollout_seed", "rollout_source"]
