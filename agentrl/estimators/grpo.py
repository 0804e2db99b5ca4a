"""GRPO: episode-level group normalisation.

Each step row j carries the score ``s_j`` of its episode (the trajectory's return, minus the
invalid-action penalty when row j itself was invalid; see :func:`common.row_returns`)::

    A_j = (s_j - mean_g(s)) / (std_g(s) + epsilon)     norm_by_std=True (GRPO)
    A_j =  s_j - mean_g(s)                             norm_by_std=False (Dr. GRPO)

``g`` is the row's group. With ``episode_stats="steps"`` (default, as the reference code) mean
and std run over every step row of the group, so longer trajectories weigh more; with
``"trajectories"`` over one return per trajectory. The std is the unbiased one. A group with a
single member keeps its raw score (mean 0, std 1), as the reference code does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from agentrl.data import StepBatch
from agentrl.estimators import common
from agentrl.estimators.registry import EPISODE_STATS, PENALTY_MODES, check_choice, register_estimator


@dataclasses.dataclass(frozen=True)
class GRPOParams:
    norm_by_std: bool = dataclasses.field(default=True, metadata={
        "help": "divide by the group std (GRPO); False gives the mean-centred Dr. GRPO advantage"})
    epsilon: float = common.epsilon_field()
    episode_stats: str = common.episode_stats_field()
    invalid_action_penalty: float = common.penalty_field()
    penalty_mode: str = common.penalty_mode_field()

    def __post_init__(self) -> None:
        check_choice("grpo", "episode_stats", self.episode_stats, EPISODE_STATS)
        check_choice("grpo", "penalty_mode", self.penalty_mode, PENALTY_MODES)


@register_estimator("grpo", GRPOParams)
def grpo_advantages(batch: StepBatch, params: GRPOParams, state=None) -> tuple[torch.Tensor, dict[str, float]]:
    layout = common.TrajectoryLayout.of(batch)
    returns = common.row_returns(batch, layout, 1.0, params.invalid_action_penalty, params.penalty_mode,
                                 step=False)
    adv, group, num_groups = common.episode_advantage(batch, returns, params.norm_by_std, params.epsilon,
                                                      params.episode_stats)
    diagnostics = {
        "num_groups": float(num_groups),
        "singleton_group_rate": common.singleton_rate(group, num_groups),
    }
    return torch.from_numpy(adv.numpy().astype(np.float32)), diagnostics
