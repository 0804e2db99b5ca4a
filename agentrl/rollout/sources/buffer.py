"""The buffer of whole groups that the overlapped modes' sources share.

Results enter the :class:`GroupBuffer` in the order they were produced, split into whole groups (every
episode of a group and its expert-guided episode, if any), so a group-based estimator sees exactly
what a synchronous rollout gives it. A group's *staleness* at the learner is the learner's policy
version minus the oldest version that generated one of its steps; a group staler than
``max_staleness`` is dropped, counted, and its place filled by later groups.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from agentrl.data.step_batch import StepBatch
from agentrl.envs.base import TaskRef
from agentrl.rollout.engine import EpisodeResult, RolloutResult


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


__all__ = ["Group", "GroupBuffer", "TakenBatch", "add_stats", "episode_from_dict", "merge_groups", "split_groups",
           "versions_per_episode"]
