"""Whole groups over one engine's env instances, started as instances free up.

A synchronous rollout call starts a wave of groups together and returns when the slowest episode
is done. The streaming rollout (``trainer.mode=async``) instead keeps every env instance busy: a
:class:`GroupPool` on each rollout worker holds the groups it was given, starts one as soon as
``group_size`` instances are free, advances every running episode together (one generate call and
one batched env step per step, whatever step each episode is at) and hands each group back the
moment its last episode is done::

    pool = GroupPool(engine, group_size=8, sampling=..., seed=...)
    pool.add([GroupSpec(task, group_id=41, traj_id_start=328)])
    while pool.busy:
        for result in pool.step():         # RolloutResult of each group finished in this step
            ...

A group's result is exactly what a synchronous rollout gives for it: the records of its G episodes
(trajectory ids ``traj_id_start + k``), its expert-guided episode when every sampled one failed
and ``expert_guidance`` is on (played on the group's own instances, freed at that moment), anchor
keys numbered within the group. An episode that an environment failure ends is played again from
reset on its instance (``rollout.on_env_failure=rerun``, after a pause that grows with each
attempt) or left out of the batch (``mask``); more than ``rollout.max_env_failures`` failed
episodes among the groups of one iteration's share of the schedule (``failure_block`` groups)
raise :class:`~agentrl.rollout.engine.EnvFailureLimitError`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from agentrl.data.step_batch import StepBatch
from agentrl.envs.base import TaskRef
from agentrl.generation.base import SamplingParams
from agentrl.rollout.engine import (RERUN_PAUSE_S, EnvFailureLimitError, Episode, RolloutEngine, RolloutResult, Tally,
                                    step_seed)
from agentrl.rollout.guidance import play_guided_episodes


@dataclass(frozen=True)
class GroupSpec:
    """One group to play: its task, its group id and the id of its first trajectory."""

    task: TaskRef
    group_id: int
    traj_id_start: int

    def to_dict(self) -> dict:
        return {"task": self.task.to_dict(), "group_id": self.group_id, "traj_id_start": self.traj_id_start}

    @classmethod
    def from_dict(cls, data: dict) -> "GroupSpec":
        return cls(TaskRef.from_dict(data["task"]), int(data["group_id"]), int(data["traj_id_start"]))


@dataclass
class RunningGroup:
    """A group on its instances: the episodes playing now and the ones already done."""

    spec: GroupSpec
    instance_ids: list[int]
    playing: list[Episode] = field(default_factory=list)
    done: list[Episode] = field(default_factory=list)
    failed: list[Episode] = field(default_factory=list)   # masked (rollout.on_env_failure=mask)
    reruns: int = 0


class GroupPool:
    """The groups one rollout engine plays at once (see the module docstring)."""

    def __init__(self, engine: RolloutEngine, group_size: int, sampling: SamplingParams, seed: int, *,
                 expert_guidance: bool = False, failure_block: int = 0):
        if len(engine.instance_ids) < group_size:
            raise ValueError(f"group size {group_size} needs {group_size} env instances, this engine has "
                             f"{len(engine.instance_ids)}")
        self.engine, self.group_size, self.sampling, self.seed = engine, group_size, sampling, int(seed)
        self.expert_guidance = expert_guidance
        self.failure_block = int(failure_block)
        self.on_failure = getattr(engine.rollout_cfg, "on_env_failure", "rerun")
        self.max_failures = int(getattr(engine.rollout_cfg, "max_env_failures", 16))
        self.waiting: deque[GroupSpec] = deque()
        self.running: list[RunningGroup] = []
        self.free: list[int] = list(engine.instance_ids)
        self.restarts: list[tuple[float, RunningGroup, Episode]] = []     # (not before, group, failed episode)
        self.failures_by_block: dict[int, int] = {}
        self.tally = Tally()
        self.extra: dict[str, float] = dict.fromkeys(("env_failures", "episodes_rerun", "episodes_masked",
                                                      "episodes", "groups"), 0.0)
        self.generate_calls = 0

    # ----- what the pool holds ---------------------------------------------------------------------
    def add(self, specs) -> None:
        self.waiting.extend(specs)

    @property
    def busy(self) -> bool:
        """Whether an episode is playing or waiting for a reset."""
        return bool(self.running)

    def take_waiting(self) -> list[GroupSpec]:
        """The groups not started yet (they leave the pool)."""
        specs, self.waiting = list(self.waiting), deque()
        return specs

    def drain_stats(self) -> dict[str, float]:
        """Counters and seconds since the last call (``RolloutResult.stats`` keys)."""
        extra, self.extra = self.extra, dict.fromkeys(self.extra, 0.0)
        return {**self.tally.drain(), **extra}

    # ----- one step --------------------------------------------------------------------------------
    def step(self) -> list[RolloutResult]:
        """Start what fits, advance every playing episode once, and return the groups that finished."""
        self._start()
        playing = [e for g in self.running for e in g.playing if not e.done]
        if playing:
            seed = step_seed(self.seed, 0, self.generate_calls)
            self.generate_calls += 1
            self.engine.advance(playing, self.sampling.with_seed(seed), self.tally)
        elif self.restarts:
            time.sleep(min(0.05, max(0.0, self.restarts[0][0] - time.monotonic())))
        finished = []
        for group in list(self.running):
            self._settle(group)
            if not group.playing and not any(g is group for _, g, _ in self.restarts):
                self.running.remove(group)
                finished.append(self._result(group))
        return finished

    def _start(self) -> None:
        """Reset the instances of new groups (while ``group_size`` are free) and of episodes to play again."""
        slots, owners = [], []
        now = time.monotonic()
        due = [item for item in self.restarts if item[0] <= now]
        self.restarts = [item for item in self.restarts if item[0] > now]
        for _, group, episode in due:
            slots.append((group.spec.task, group.spec.group_id, episode.traj_id, episode.instance_id))
            owners.append(group)
        while self.waiting and len(self.free) >= self.group_size:
            spec = self.waiting.popleft()
            ids, self.free = self.free[:self.group_size], self.free[self.group_size:]
            group = RunningGroup(spec, ids)
            self.running.append(group)
            self.extra["groups"] += 1
            for k, iid in enumerate(ids):
                slots.append((spec.task, spec.group_id, spec.traj_id_start + k, iid))
                owners.append(group)
        if slots:
            for group, episode in zip(owners, self.engine.start_episodes(slots, self.tally)):
                group.playing.append(episode)

    def _settle(self, group: RunningGroup) -> None:
        """Move the group's finished episodes out of ``playing``; a failed one is played again or masked."""
        still = []
        for episode in group.playing:
            if not episode.done:
                still.append(episode)
                continue
            if episode.error is None:
                group.done.append(episode)
                continue
            self._count_failure(group, episode)
            if self.on_failure == "mask":
                self.extra["episodes_masked"] += 1
                group.failed.append(episode)
            else:
                self.extra["episodes_rerun"] += 1
                group.reruns += 1
                pause = min(RERUN_PAUSE_S * 2 ** (group.reruns - 1), 5.0)
                self.restarts.append((time.monotonic() + pause, group, episode))
        group.playing = still

    def _count_failure(self, group: RunningGroup, episode: Episode) -> None:
        self.extra["env_failures"] += 1
        block = group.spec.group_id // self.failure_block if self.failure_block else 0
        count = self.failures_by_block.get(block, 0) + 1
        self.failures_by_block[block] = count
        if count > self.max_failures:
            advice, resume_when = self.engine.failure_advice()
            raise EnvFailureLimitError(
                f"{count} {self.engine.env_name} episodes failed in one iteration's groups on one rollout worker, "
                f"more than rollout.max_env_failures={self.max_failures} (last: episode {episode.traj_id}: "
                f"{episode.error}); {advice}", resume_when)

    def _result(self, group: RunningGroup) -> RolloutResult:
        """The group's records and episodes; its instances are free again."""
        batch, episodes = self.engine.finish_episodes(group.done)
        if group.failed:
            episodes = sorted(episodes + [e.finish() for e in group.failed], key=lambda e: e.traj_id)
        self.extra["episodes"] += len(episodes)
        stats: dict[str, float] = {}
        if self.expert_guidance and group.done and not any(e.won for e in group.done):
            guided, stats = play_guided_episodes(self.engine, [(group.spec.task, group.spec.group_id)],
                                                 group.instance_ids)
            if guided is not None:
                batch = StepBatch.concat([batch, guided]) if batch is not None else guided
        self.free.extend(group.instance_ids)
        if batch is not None:
            batch = batch.with_anchor_keys()
        return RolloutResult(batch, episodes, stats)


__all__ = ["GroupPool", "GroupSpec", "RunningGroup"]
