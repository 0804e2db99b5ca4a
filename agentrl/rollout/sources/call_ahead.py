"""``trainer.mode=one_step_off``: numbered rollout calls, one iteration ahead of the learner.

The rollout workers stay busy while the learner updates (docs/async.md). The unit of work is a
*call*: call ``c`` rolls out exactly the tasks and seed that iteration ``c`` of a synchronous run would (:class:`~agentrl.runs.task_schedule.TaskSchedule`), with the
group ids ``(c - 1) * tasks_per_iteration ...`` so that groups of different calls never share an id::

    stream = RolloutStream(rollout_workers, schedule, ...)
    stream.submit_until(iteration + max_staleness)       # calls queue on the workers, FIFO
    taken = stream.next_batch(version=iteration - 1)     # waits for whole groups, drops stale ones
    ... learner ...
    stream.save(checkpoint_dir / "rollout_buffer")       # buffered groups + the calls in flight

Results enter the :class:`~agentrl.rollout.sources.buffer.GroupBuffer` in call order, as whole groups;
a group staler than ``max_staleness`` is dropped, counted, and its place filled by the next call's
groups. Weights change only between calls (:meth:`CallAheadRollout.before_push`).
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from agentrl.envs.base import TaskRef
from agentrl.rollout.sources.base import RolloutSource, Taken, rollout_seed
from agentrl.rollout.sources.buffer import GroupBuffer, TakenBatch, merge_groups

STATE_FILE = "stream.json"


@dataclass
class CallSpec:
    """What call ``call_id`` rolls out: the tasks and seed of iteration ``call_id`` of a synchronous run."""

    call_id: int
    tasks: list[TaskRef]
    seed: int
    first_group_id: int


@dataclass
class RolloutStream:
    """Rollout calls submitted ahead of the learner and the buffer their groups wait in.

    ``tasks_of(c)`` and ``seed_of(c)`` give call ``c``'s tasks and sampling seed; calls are numbered
    from 1 like iterations. The workers (:class:`~agentrl.rollout.workers.RolloutWorkerGroup`)
    run their calls in the order they were submitted; results enter the buffer in call order.
    """

    workers: Any
    tasks_of: Callable[[int], Sequence[TaskRef]]
    seed_of: Callable[[int], int]
    group_size: int
    tasks_per_call: int
    expert_guidance: bool = False
    next_call: int = 1
    buffer: GroupBuffer = field(default_factory=GroupBuffer)
    in_flight: deque = field(default_factory=deque)     # (CallSpec, PendingRollout), oldest first
    resubmitted: int = 0                                 # calls in flight at the checkpoint, run again on resume

    def spec(self, call_id: int) -> CallSpec:
        return CallSpec(call_id, list(self.tasks_of(call_id)), int(self.seed_of(call_id)),
                        (call_id - 1) * self.tasks_per_call)

    def submit(self, spec: CallSpec) -> None:
        pending = self.workers.submit(spec.tasks, self.group_size, seed=spec.seed, expert_guidance=self.expert_guidance,
                                      first_group_id=spec.first_group_id)
        self.in_flight.append((spec, pending))

    def submit_until(self, last_call: int, groups_needed: int) -> None:
        """Submit calls up to ``last_call`` while the groups buffered and in flight are fewer than
        ``groups_needed`` (what the remaining iterations will take)."""
        while self.next_call <= last_call and \
                len(self.buffer) + len(self.in_flight) * self.tasks_per_call < groups_needed:
            self.submit(self.spec(self.next_call))
            self.next_call += 1

    def collect(self, wait: bool) -> bool:
        """Move the oldest call's result into the buffer when it is done (``wait``: until it is);
        False when nothing moved."""
        if not self.in_flight:
            return False
        spec, pending = self.in_flight[0]
        if not wait and not pending.done():
            return False
        result = pending.result()
        self.in_flight.popleft()
        self.buffer.add(spec.call_id, result)
        return True

    def running(self) -> bool:
        """Whether a rollout call is still running (or queued) on the workers."""
        return any(not pending.done() for _, pending in self.in_flight)

    def collect_done(self) -> None:
        while self.collect(wait=False):
            pass

    def next_batch(self, version: int, max_staleness: int) -> TakenBatch:
        """``tasks_per_call`` fresh groups for the learner at policy ``version``: waits for calls in
        order; stale groups are dropped, and when the calls in flight cannot replace them the next
        call is submitted (it runs on the newest weights). Groups leave the buffer only once all of
        them are there: a call that fails while this waits leaves the buffer as it was (minus stale
        groups), so a checkpoint written then still holds every group."""
        start = time.perf_counter()
        dropped = self.buffer.drop_stale(version, max_staleness)
        replacement, dropped_since = None, 0
        while len(self.buffer) < self.tasks_per_call:
            if not self.in_flight:
                if replacement is not None and dropped_since:
                    raise RuntimeError(f"rollout call {replacement} was submitted at learner version {version} and "
                                       f"still gave groups more than {max_staleness} versions older: the rollout "
                                       "workers did not receive the learner's weights")
                replacement, dropped_since = self.next_call, 0
                self.submit(self.spec(self.next_call))
                self.next_call += 1
            self.collect(wait=True)
            self.collect_done()
            gone = self.buffer.drop_stale(version, max_staleness)
            dropped += gone
            dropped_since += gone
        taken, staleness = self.buffer.take(self.tasks_per_call, version)
        waited = time.perf_counter() - start
        result = merge_groups(taken, self.buffer.drain_stats())
        return TakenBatch(result, staleness, dropped, waited, len(self.buffer), self.buffer.dropped_total)

    def wait_for_all(self) -> None:
        """Every call in flight finished and buffered (one_step_off: before the weights change)."""
        while self.collect(wait=True):
            pass

    def wait_for_call(self, call_id: int) -> None:
        """Call ``call_id`` and the ones before it finished and buffered."""
        while self.in_flight and self.in_flight[0][0].call_id <= call_id:
            self.collect(wait=True)

    def cancel(self) -> None:
        """Give up the calls in flight (the run is over): queued ones never start."""
        import ray

        for _, pending in self.in_flight:
            for ref in pending.calls:
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001 - a call that already finished cannot be cancelled
                    pass
        self.in_flight.clear()

    # ----- checkpoints ---------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """The buffered groups and the ids of the calls still in flight (their episodes are not saved:
        a resumed run submits those calls again, with the same tasks and seeds)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.buffer.save(directory)
        (directory / STATE_FILE).write_text(json.dumps({
            "next_call": self.next_call, "in_flight": [spec.call_id for spec, _ in self.in_flight],
            "stats": self.buffer.stats, "dropped_total": self.buffer.dropped_total}))

    def restore(self, directory: Path) -> int:
        """Load a saved buffer and submit the calls that were in flight again; the groups restored."""
        state = json.loads((directory / STATE_FILE).read_text())
        self.buffer = GroupBuffer.load(directory, state["stats"], state["dropped_total"])
        for call_id in state["in_flight"]:
            self.submit(self.spec(int(call_id)))
        self.resubmitted = len(state["in_flight"])
        self.next_call = int(state["next_call"])
        return len(self.buffer)


class CallAheadRollout(RolloutSource):
    """``trainer.mode=one_step_off``: numbered rollout calls, one iteration ahead of the learner."""

    max_staleness = 1

    def __init__(self, workers, tasks_of, seed_of, group_size: int, tasks_per_iteration: int, iterations: int,
                 expert_guidance: bool = False):
        self.iterations, self.tasks_per_iteration = iterations, tasks_per_iteration
        self.stream = RolloutStream(workers, tasks_of, seed_of, group_size, tasks_per_iteration,
                                    expert_guidance=expert_guidance)

    @classmethod
    def from_config(cls, cfg, workers, tasks_of) -> "CallAheadRollout":
        return cls(workers, tasks_of, lambda iteration: rollout_seed(cfg.trainer.seed, iteration), cfg.env.group_size,
                   cfg.env.tasks_per_iteration, cfg.trainer.iterations, cfg.rollout.expert_guidance)

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


__all__ = ["CallAheadRollout", "CallSpec", "RolloutStream"]
