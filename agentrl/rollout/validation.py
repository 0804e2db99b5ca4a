"""Validation rollouts: one episode per task (group size 1), greedy or at a low temperature.

    tasks = eval_tasks(split_sizes, "test", num_tasks=200)
    result = validate(runner, tasks, temperature=0.0, seed=0)
    result.success_rate, result.success_by_type, result.metrics("val/")

``runner`` is a :class:`~agentrl.rollout.engine.RolloutEngine` or a
:class:`~agentrl.rollout.workers.RolloutWorkerGroup`: anything with
``sampling_params(temperature, seed)`` and ``run(tasks, group_size, sampling=, seed=)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from agentrl.envs.base import TaskRef
from agentrl.rollout.engine import EpisodeResult


@dataclass
class ValidationResult:
    episodes: list[EpisodeResult]
    success_rate: float
    success_by_type: dict[str, float]
    mean_return: float
    mean_length: float
    invalid_action_rate: float

    def metrics(self, prefix: str = "val/") -> dict[str, float]:
        out = {f"{prefix}success_rate": self.success_rate, f"{prefix}episode_return": self.mean_return,
               f"{prefix}episode_length": self.mean_length, f"{prefix}invalid_action_rate": self.invalid_action_rate,
               f"{prefix}episodes": float(len(self.episodes))}
        out.update({f"{prefix}success_rate/{t}": v for t, v in sorted(self.success_by_type.items())})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"success_rate": self.success_rate, "success_by_type": dict(self.success_by_type),
                "mean_return": self.mean_return, "mean_length": self.mean_length,
                "invalid_action_rate": self.invalid_action_rate, "episodes": [e.to_dict() for e in self.episodes]}


def eval_tasks(split_sizes: Mapping[str, int], split: str, num_tasks: int = 0) -> list[TaskRef]:
    """The first ``num_tasks`` tasks of ``split`` (0 = all of them), in index order."""
    if split not in split_sizes:
        raise ValueError(f"unknown split {split!r}; available: {sorted(split_sizes)}")
    size = int(split_sizes[split])
    count = size if num_tasks <= 0 else min(int(num_tasks), size)
    return [TaskRef(split, i) for i in range(count)]


def summarize(episodes: Sequence[EpisodeResult]) -> ValidationResult:
    """Success rate (overall and per task type), mean return and length, invalid-action rate."""
    n = max(1, len(episodes))
    by_type: dict[str, list[bool]] = {}
    for e in episodes:
        by_type.setdefault(e.task_type, []).append(e.won)
    steps = sum(e.length for e in episodes)
    return ValidationResult(
        episodes=list(episodes),
        success_rate=sum(e.won for e in episodes) / n,
        success_by_type={t: sum(w) / len(w) for t, w in by_type.items()},
        mean_return=sum(e.episode_return for e in episodes) / n,
        mean_length=steps / n,
        invalid_action_rate=sum(e.invalid_actions for e in episodes) / max(1, steps),
    )


def validate(runner, tasks: Sequence[TaskRef], *, temperature: float = 0.0, seed: int = 0) -> ValidationResult:
    """Play every task once (group size 1) at ``temperature`` (0 = greedy) and summarise."""
    sampling = runner.sampling_params(temperature=temperature, seed=seed)
    result = runner.run(list(tasks), 1, sampling=sampling, seed=seed)
    return summarize(result.episodes)


__all__ = ["ValidationResult", "eval_tasks", "summarize", "validate"]
