"""REINFORCE++-baseline (Hu et al., 2025, "REINFORCE++", the group-baseline variant).

The group mean is the baseline; the differences are then whitened over the whole batch instead of
inside each group (GRPO's division by a group std is what this variant avoids: a group whose
returns barely differ gets no huge advantages)::

    d_j = s_j - mean_g(s)                              s_j: the row's episode score (as GRPO)
    A_j = (d_j - mean_B(d)) / (std_B(d) + epsilon)      mean and std over every row of the batch

``g`` is the row's group; its mean runs over the group's step rows (``episode_stats="steps"``) or
over one return per trajectory (``"trajectories"``, the row's own invalid-action penalty then
stays in ``s_j`` but not in the mean). A group with a single member is its own baseline (d = 0),
as in OpenRLHF's implementation. The batch std is the unbiased one over rows; a batch whose
differences are all equal gets advantages of 0.

This module uses only the public estimator interface (``agentrl.estimators``): it is also the
worked example of ``docs/estimators.md``, "Write your own estimator".
"""

from __future__ import annotations

import dataclasses

import torch

from agentrl.data import StepBatch
from agentrl.estimators import Estimator, param, register_estimator, shared


@register_estimator
class ReinforcePPBaseline(Estimator):
    name = "reinforce_pp"
    title = "REINFORCE++-baseline"
    table_rank = 25

    @dataclasses.dataclass(frozen=True)
    class Params:
        epsilon: float = shared("epsilon")
        episode_stats: str = shared("episode_stats")
        penalty_mode: str = shared("penalty_mode")
        whiten: bool = param(True, "divide by the batch std after subtracting the batch mean (false: only the "
                             "group-mean baseline)")

    def advantages(self, batch: StepBatch, state=None) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        score, traj_return = episode_scores(batch, p.penalty_mode)
        group = torch.unique(batch.group_id, return_inverse=True)[1]
        num_groups = int(group.max()) + 1 if len(batch) else 0
        if p.episode_stats == "steps":
            members, member_group = score, group
        else:
            rows = one_row_per_trajectory(batch)
            members, member_group = traj_return[rows], group[rows]
        count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, member_group, torch.ones_like(members))
        total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, member_group, members)
        baseline = torch.where(count[group] > 1, total[group] / count[group].clamp_min(1), score)
        diff = score - baseline
        if p.whiten and len(batch) > 1:
            centred = diff - diff.mean()
            adv = centred / (centred.std() + p.epsilon)
        else:
            adv = diff
        diagnostics = {
            "num_groups": float(num_groups),
            "baseline_abs_mean": float(baseline.abs().mean()) if len(batch) else 0.0,
            "batch_std": float(diff.std()) if len(batch) > 1 else 0.0,
        }
        return adv.to(torch.float32), diagnostics


def episode_scores(batch: StepBatch, penalty_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row (float64): the episode score s_j and the return of the row's trajectory.

    The step reward is ``env_reward - noop_penalty``; the invalid-action penalty is one more
    reward with ``penalty_mode="in_reward"``, or charged to the invalid row's own score only
    (``after_discount``).
    """
    reward = batch.env_reward.double() - batch.noop_penalty.double()
    penalty = batch.invalid_penalty.double()
    if penalty_mode == "in_reward":
        reward, penalty = reward - penalty, torch.zeros_like(penalty)
    traj = torch.unique(batch.traj_id, return_inverse=True)[1]
    num_traj = int(traj.max()) + 1 if len(batch) else 0
    traj_return = torch.zeros(num_traj, dtype=torch.float64).index_add_(0, traj, reward)[traj]
    return traj_return - penalty, traj_return


def one_row_per_trajectory(batch: StepBatch) -> torch.Tensor:
    """The first row of every trajectory (any row serves: they share the return)."""
    traj = torch.unique(batch.traj_id, return_inverse=True)[1]
    first = torch.full((int(traj.max()) + 1 if len(batch) else 0,), len(batch), dtype=torch.int64)
    return first.scatter_reduce_(0, traj, torch.arange(len(batch)), reduce="amin")
