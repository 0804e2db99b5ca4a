"""Which tasks each training iteration plays: the iteration -> tasks schedule.

:class:`TaskSchedule` walks the training split in seeded epochs: a pure function of (seed,
iteration), so a resumed run plays exactly the tasks the killed run would have played. It also
answers the questions about the environment's splits that the trainer, the evaluation and the warm
start ask (their sizes).
"""

from __future__ import annotations

import functools
import json
import random

from agentrl.envs import TaskRef, make_env
from agentrl.errors import UsageError


class TaskSchedule:
    """Which tasks iteration ``i`` trains on: a pure function of (seed, i).

    The training split is walked in epochs; each epoch is a fresh seeded shuffle. Because nothing
    but the iteration number is needed, a resumed run continues with exactly the tasks the killed
    run would have used.
    """

    def __init__(self, split: str, size: int, per_iteration: int, seed: int):
        if size < 1:
            raise UsageError(f"training split {split!r} is empty")
        self.split, self.size, self.per_iteration, self.seed = split, size, per_iteration, seed

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def _env(env_name: str, kwargs_json: str):
        return make_env(env_name, **json.loads(kwargs_json))

    @classmethod
    def env_for(cls, env_cfg):
        """One environment instance per (name, kwargs), built once per process, for what the
        schedule asks about splits (sizes, goals); it is never reset."""
        return cls._env(env_cfg.name, json.dumps(dict(env_cfg.kwargs), sort_keys=True))

    @classmethod
    def split_sizes(cls, env_cfg) -> dict[str, int]:
        return dict(cls.env_for(env_cfg).split_sizes())

    @classmethod
    def checked_split_size(cls, env_cfg, split: str, key: str) -> int:
        """The number of tasks in ``split``; a usage error naming ``key`` (the setting that chose the
        split) when the environment has no such split."""
        sizes = cls.split_sizes(env_cfg)
        if split not in sizes:
            raise UsageError(f"{key}={split!r} is not a split of {env_cfg.name}; available: {', '.join(sorted(sizes))}")
        return sizes[split]

    @classmethod
    def for_split(cls, env_cfg, seed: int) -> "TaskSchedule":
        size = cls.checked_split_size(env_cfg, env_cfg.train_split, "env.train_split")
        return cls(env_cfg.train_split, size, env_cfg.tasks_per_iteration, seed)

    @functools.lru_cache(maxsize=4)
    def _epoch_order(self, epoch: int) -> tuple[int, ...]:
        order = list(range(self.size))
        random.Random(self.seed * 7919 + epoch).shuffle(order)
        return tuple(order)

    def tasks_for(self, iteration: int) -> list[TaskRef]:
        start = (iteration - 1) * self.per_iteration
        positions = range(start, start + self.per_iteration)
        return [TaskRef(self.split, self._epoch_order(p // self.size)[p % self.size]) for p in positions]
