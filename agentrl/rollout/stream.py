"""Rollouts that run ahead of the learner: numbered rollout calls, and a buffer of whole groups.

``trainer.mode`` one_step_off and async (docs/async.md) keep the rollout workers busy while the
learner updates. The unit of work is a *call*: call ``c`` rolls out exactly the tasks and seed that
iteration ``c`` of a synchronous run would (:class:`~agentrl.runs.task_schedule.TaskSchedule`), with the
group ids ``(c - 1) * tasks_per_iteration ...`` so that groups of different calls never share an id::

    stream = RolloutStream(rollout_workers, schedule, ...)
    stream.submit_until(iteration + max_staleness)       # calls queue on the workers, FIFO
    taken = stream.next_batch(version=iteration - 1)     # waits for whole groups, drops stale ones
    ... learner ...
    stream.save(checkpoint_dir / "rollout_buffer")       # buffered groups + the calls in flight

Results enter the :class:`GroupBuffer` in call order, split into whole groups (every episode of a
group and its expert-guided episode, if any), so a group-based estimator sees exactly what a
synchronous rollout gives it. A group's *staleness* at the learner is the learner's policy version
minus the oldest version that generated one of its steps; a group staler than ``max_staleness`` is
dropped, counted, and its place filled by the next call's groups.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from agentrl.data.step_batch import StepBatch
from agentrl.envs.base import TaskRef
from agentrl.rollout.engine import EpisodeResult, RolloutResult

STATE_FILE = "stream.json"


@dataclass
class Group:
    """One group of one rollout call: its step records and its (sampled) episodes."""

    call_id: int
    group_id: int
    batch: StepBatch
    episodes: list[EpisodeResult]

    @property
    def oldest_version(self) -> int:
        return int(self.batch.policy_version.min())


@dataclass
class TakenBatch:
    """What :meth:`RolloutStream.next_batch` hands the learner."""

    result: RolloutResult            # the groups' rows and episodes; stats of the calls that arrived since the last take
    staleness: list[int]             # per trained group
    dropped: int                     # groups dropped for staleness while this batch was taken
    learner_wait_s: float            # how long the learner waited for these groups
    buffered_groups: int             # groups left in the buffer after the take
    dropped_total: int = 0           # groups dropped for staleness since the run began

    def metrics(self) -> dict[str, float]:
        """Staleness histogram, policy versions per episode, drops, waits, buffer size."""
        batch = self.result.batch
        out = {"async/staleness_mean": sum(self.staleness) / max(1, len(self.staleness)),
               "async/staleness_max": float(max(self.staleness, default=0)),
               "async/groups_dropped": float(self.dropped), "async/groups_dropped_total": float(self.dropped_total),
               "async/buffer_groups": float(self.buffered_groups),
               "time/learner_wait_s": self.learner_wait_s}
        for value in sorted(set(self.staleness)):
            out[f"async/staleness_{value}_groups"] = float(self.staleness.count(value))
        spans = versions_per_episode(batch)
        out["async/versions_per_episode_mean"] = sum(spans) / max(1, len(spans))
        out["async/versions_per_episode_max"] = float(max(spans, default=0))
        return out


def versions_per_episode(batch: StepBatch) -> list[int]:
    """How many policy versions generated the steps of each sampled episode of ``batch``."""
    sampled = ~batch.is_expert
    pairs = torch.unique(torch.stack([batch.traj_id[sampled], batch.policy_version[sampled]]), dim=1)
    _, counts = torch.unique(pairs[0], return_counts=True)
    return counts.tolist()


def add_stats(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Counters and times summed, ``max_*`` entries the maximum (as :meth:`RolloutResult.merge`)."""
    out = dict(total)
    for key, value in more.items():
        out[key] = max(out.get(key, value), value) if key.startswith("max_") else out.get(key, 0.0) + value
    return out


def split_groups(call_id: int, result: RolloutResult) -> list[Group]:
    """A call's result as whole groups, in group-id order (a group without a recorded step, every
    episode of it lost to env failures, is left out)."""
    batch = result.batch
    groups = []
    for gid in sorted(set(batch.group_id.tolist())):
        rows = batch.group_id == gid
        groups.append(Group(call_id, gid, batch.select(rows), [e for e in result.episodes if e.group_id == gid]))
    return groups


def merge_groups(groups: Sequence[Group], stats: dict[str, float]) -> RolloutResult:
    batch = StepBatch.concat([g.batch for g in groups])
    episodes = sorted((e for g in groups for e in g.episodes), key=lambda e: e.traj_id)
    return RolloutResult(batch, episodes, stats)


class GroupBuffer:
    """Whole groups waiting for the learner, oldest call first."""

    def __init__(self) -> None:
        self.groups: deque[Group] = deque()
        self.stats: dict[str, float] = {}      # of the calls that arrived since the last take
        self.dropped_total = 0

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, call_id: int, result: RolloutResult) -> None:
        self.groups.extend(split_groups(call_id, result))
        self.stats = add_stats(self.stats, result.stats)

    def drop_stale(self, version: int, max_staleness: int) -> int:
        """Drop every group more than ``max_staleness`` versions behind ``version`` (it only gets older);
        how many were dropped."""
        fresh = deque(g for g in self.groups if version - g.oldest_version <= max_staleness)
        dropped = len(self.groups) - len(fresh)
        self.groups = fresh
        self.dropped_total += dropped
        return dropped

    def take(self, count: int, version: int) -> tuple[list[Group], list[int]]:
        """``count`` groups (fewer if the buffer has fewer), the stalest first (the smallest oldest
        version; among equals the first to arrive), and their staleness at ``version``. Stalest first:
        a group that took long (an episode that ran to the step limit) arrives behind quicker ones
        and would otherwise wait in the buffer until it is too stale and dropped, which would leave
        the slow, mostly failing, groups out of training more often than the quick ones."""
        order = sorted(range(len(self.groups)), key=lambda i: (self.groups[i].oldest_version, i))[:count]
        taken = [self.groups[i] for i in order]
        chosen = set(order)
        self.groups = deque(g for i, g in enumerate(self.groups) if i not in chosen)
        return taken, [version - g.oldest_version for g in taken]

    def drain_stats(self) -> dict[str, float]:
        stats, self.stats = self.stats, {}
        return stats

    # ----- disk ----------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """One subdirectory per buffered group: its StepBatch and episodes."""
        for i, group in enumerate(self.groups):
            where = directory / f"group_{i:05d}"
            group.batch.save(where / "batch")
            (where / "group.json").write_text(json.dumps({
                "call_id": group.call_id, "group_id": group.group_id,
                "episodes": [e.to_dict() for e in group.episodes]}))

    @classmethod
    def load(cls, directory: Path, stats: dict[str, float], dropped_total: int) -> "GroupBuffer":
        buffer = cls()
        for where in sorted(directory.glob("group_*")):
            meta = json.loads((where / "group.json").read_text())
            episodes = [episode_from_dict(e) for e in meta["episodes"]]
            buffer.groups.append(Group(meta["call_id"], meta["group_id"], StepBatch.load(where / "batch"), episodes))
        buffer.stats, buffer.dropped_total = dict(stats), int(dropped_total)
        return buffer


def episode_from_dict(data: dict[str, Any]) -> EpisodeResult:
    fields = dict(data)
    fields["task"] = TaskRef.from_dict(fields["task"])
    return EpisodeResult(**fields)


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


__all__ = ["CallSpec", "Group", "GroupBuffer", "RolloutStream", "TakenBatch", "split_groups", "versions_per_episode"]
