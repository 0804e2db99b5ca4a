"""Which tasks an iteration trains on when ``trainer.curriculum.mode=prioritized``.

Group-based estimators learn only from groups whose episodes end differently: a group that all
won (or, without expert guidance, all failed) has advantage 0 everywhere and costs a rollout for
nothing. On the tiny TextCraft recipe a third of the pool's goals are solved in every layout from
the warm start on, so under uniform sampling about 7 of 16 groups per iteration train nothing.

The prioritized schedule weights every task by the state of its *goal* (tasks that share a goal
are the same goal in other layouts, ``TextEnv.task_goals``), read off the goal's latest ``window``
groups of sampled episodes (expert-guided episodes and those an env failure ended are not
counted):

* every one of those groups won all its episodes: ``mastered_weight`` (default 0.1);
* every one of them lost all its episodes: ``unsolved_weight`` (default 1.0);
* anything else, or a goal not played yet: 1.

Mastered goals keep a small weight, so a goal the policy forgets is drawn again, its groups turn
mixed and its weight returns to 1. Each iteration draws ``tasks_per_iteration`` distinct tasks,
with probability proportional to weight (weighted sampling without replacement, seeded by the run
seed and the iteration). The state is a dict of recent outcomes per goal, saved in every
checkpoint, so a resumed run draws the tasks the killed run would have drawn.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any, Iterable

from agentrl.envs.base import TaskRef
from agentrl.task_schedule import TaskSchedule

MASTERED, UNSOLVED, LEARNING = "mastered", "unsolved", "learning"


def split_goals(env_cfg, split: str, size: int) -> tuple[str, ...]:
    """The goal of every task of ``split``; a task is its own goal when the env does not say.
    Asks the instance the task schedule already built for the split sizes."""
    goals = TaskSchedule.env_for(env_cfg).task_goals(split)
    if goals is None:
        return tuple(f"{split}/{index}" for index in range(size))
    if len(goals) != size:
        raise ValueError(f"{env_cfg.name}.task_goals({split!r}) gave {len(goals)} goals for {size} tasks")
    return tuple(goals)


class PrioritizedSchedule:
    """Draws each iteration's tasks weighted by their goal's latest group outcomes."""

    def __init__(self, split: str, goals: tuple[str, ...], per_iteration: int, seed: int, cfg,
                 state: dict[str, Any] | None = None):
        self.split, self.goals, self.seed, self.cfg = split, goals, seed, cfg
        self.per_iteration = min(per_iteration, len(goals))
        # goal -> success rates of its latest groups, oldest first (at most cfg.window kept)
        self.recent: dict[str, list[float]] = {g: list(v) for g, v in (state or {}).get("recent", {}).items()}

    @classmethod
    def for_config(cls, cfg, state: dict[str, Any] | None = None) -> "PrioritizedSchedule":
        uniform = TaskSchedule.for_split(cfg.env, cfg.trainer.seed)
        goals = split_goals(cfg.env, uniform.split, uniform.size)
        return cls(uniform.split, goals, cfg.env.tasks_per_iteration, cfg.trainer.seed, cfg.trainer.curriculum, state)

    # ----- state --------------------------------------------------------------------------------
    def goal_state(self, goal: str) -> str:
        rates = self.recent.get(goal, [])
        if len(rates) < self.cfg.window:
            return LEARNING
        if all(r == 1.0 for r in rates):
            return MASTERED
        if all(r == 0.0 for r in rates):
            return UNSOLVED
        return LEARNING

    def weight(self, goal: str) -> float:
        return {MASTERED: self.cfg.mastered_weight, UNSOLVED: self.cfg.unsolved_weight}.get(self.goal_state(goal), 1.0)

    def record(self, episodes: Iterable) -> None:
        """Add one rollout's groups: each group's share of won episodes, for the goal of its task."""
        by_group: dict[int, list[bool]] = defaultdict(list)
        task_of: dict[int, TaskRef] = {}
        for episode in episodes:    # the policy's own episodes (guided ones are not among them)
            if episode.env_error is not None:
                continue
            by_group[episode.group_id].append(bool(episode.won))
            task_of[episode.group_id] = episode.task
        for group_id in sorted(by_group):
            task, wins = task_of[group_id], by_group[group_id]
            if task.split != self.split:
                continue
            rates = self.recent.setdefault(self.goals[task.index], [])
            rates.append(sum(wins) / len(wins))
            del rates[:-self.cfg.window]

    def as_dict(self) -> dict[str, Any]:
        return {"recent": {g: list(v) for g, v in sorted(self.recent.items())}}

    def metrics(self, tasks: list[TaskRef]) -> dict[str, float]:
        """How many goals are in each state, and how many of this iteration's tasks were mastered."""
        states = [self.goal_state(g) for g in sorted(set(self.goals))]
        return {"curriculum/mastered_goals": float(states.count(MASTERED)),
                "curriculum/unsolved_goals": float(states.count(UNSOLVED)),
                "curriculum/mastered_tasks_drawn": float(sum(self.goal_state(self.goals[t.index]) == MASTERED
                                                             for t in tasks))}

    # ----- drawing ------------------------------------------------------------------------------
    def tasks_for(self, iteration: int) -> list[TaskRef]:
        """``per_iteration`` distinct tasks, drawn with probability proportional to their weight
        (Efraimidis-Spirakis keys ``log(u) / w``); weight-0 tasks only when no other is left."""
        rng = random.Random(self.seed * 7919 + 104_729 * iteration)
        weight_of = {g: self.weight(g) for g in set(self.goals)}
        keys = []
        for index, goal in enumerate(self.goals):
            u, tie = 1.0 - rng.random(), rng.random()      # u in (0, 1]
            w = weight_of[goal]
            keys.append((math.log(u) / w if w > 0 else -math.inf, tie, index))
        keys.sort(reverse=True)
        return [TaskRef(self.split, index) for _, _, index in keys[:self.per_iteration]]
