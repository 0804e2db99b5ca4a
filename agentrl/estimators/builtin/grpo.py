"""GRPO: episode-level group normalisation.

Each step row j carries the score ``s_j`` of its episode (the trajectory's return, minus the
invalid-action penalty when row j itself was invalid; see :func:`common.row_returns`)::

    A_j = (s_j - mean_g(s)) / (std_g(s) + epsilon)     norm_by_std=True (GRPO)
    A_j =  s_j - mean_g(s)                             norm_by_std=False (Dr. GRPO)

``g`` is the row's group. With ``episode_stats="steps"`` (default, as the reference code) mean
and std run over every step row of the group, so longer trajectories weigh more; with
``"trajectories"`` over one return per trajectory (the row's own penalty is then charged after
the division, :func:`common.episode_advantage`). The std is the unbiased one. A group with a
single member keeps its raw score (mean 0, std 1), as the reference code does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from agentrl.data import StepBatch
from agentrl.estimators import common
from agentrl.estimators.base import Estimator
from agentrl.estimators.params import param, shared
from agentrl.estimators.registry import register_estimator


@register_estimator
class GRPO(Estimator):
    name = "grpo"
    title = "GRPO"
    table_rank = 10

    @dataclasses.dataclass(frozen=True)
    class Params:
        norm_by_std: bool = param(True, "divide by the group std (GRPO); false gives the mean-centred Dr. GRPO "
                                  "advantage")
        epsilon: float = shared("epsilon")
        episode_stats: str = shared("episode_stats")
        penalty_mode: str = shared("penalty_mode")

    def advantages(self, batch: StepBatch, state=None) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        layout = common.TrajectoryLayout.of(batch)
        returns = common.row_returns(batch, layout, 1.0, p.penalty_mode, step=False)
        adv, group, num_groups = common.episode_advantage(batch, returns, p.norm_by_std, p.epsilon, p.episode_stats)
        diagnostics = {
            "num_groups": float(num_groups),
            "singleton_group_rate": common.singleton_rate(group, num_groups),
        }
        return torch.from_numpy(adv.numpy().astype(np.float32)), diagnostics
