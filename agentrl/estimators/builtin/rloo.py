"""RLOO: leave-one-out baseline over the group.

With ``n`` members in the row's group (step rows, or trajectories with
``episode_stats="trajectories"``)::

    A_j = s_j - (sum_g(s) - s_j) / (n - 1)  =  n / (n - 1) * (s_j - mean_g(s))

which is the reference code's ``s * n/(n-1) - mean * n/(n-1)``. A group with a single member
keeps its raw score, as the reference code does. With trajectory statistics the member left
out is the row's own trajectory (its return without the row's penalty) and ``s_j`` still
carries the row's penalty.
"""

from __future__ import annotations

import dataclasses

import torch

from agentrl.data import StepBatch
from agentrl.estimators import common
from agentrl.estimators.base import Estimator
from agentrl.estimators.params import shared
from agentrl.estimators.registry import register_estimator


@register_estimator
class RLOO(Estimator):
    name = "rloo"
    title = "RLOO"
    table_rank = 20

    @dataclasses.dataclass(frozen=True)
    class Params:
        episode_stats: str = shared("episode_stats")
        penalty_mode: str = shared("penalty_mode")

    def advantages(self, batch: StepBatch, state=None) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        layout = common.TrajectoryLayout.of(batch)
        returns = common.row_returns(batch, layout, 1.0, p.penalty_mode, step=False)
        group, num_groups = common.group_segments(batch)
        score = returns.episode_score
        if p.episode_stats == "steps":
            total = common.segment_sum(score, group, num_groups)[group]
            count = common.segment_count(group, num_groups)[group]
            own = score
        else:
            last = batch.trajectory_rows()
            member = returns.trajectory_return[last]
            total = common.segment_sum(member, group[last], num_groups)[group]
            count = common.segment_count(group[last], num_groups)[group]
            own = returns.trajectory_return
        baseline = (total - own) / (count - 1).clamp_min(1)
        adv = torch.where(count > 1, score - baseline, score)
        diagnostics = {
            "num_groups": float(num_groups),
            "singleton_group_rate": float((count == 1).to(torch.float64).mean()) if len(batch) else 0.0,
        }
        return adv.to(torch.float32), diagnostics
