"""GAGPO: grouped value proxy, TD residuals, GAE, group-wise normalisation.

No official code exists; this follows the reconstruction of the method (one advantage per
environment step, no episode term)::

    G'_t    step return of row t (as GiGPO: clean rewards discounted with gamma, the
            invalid-action penalty charged per ``penalty_mode``)
    V(s)    mean of G' over the rows of the same group whose anchor_obs equals s
    r'_t  = G'_t - gamma * G'_{t+1}          (G' = 0 after the trajectory's last row)
    delta_t = r'_t + gamma * V(s_{t+1}) - V(s_t)   (V = 0 after the last row)
    A_t   = sum_{l >= 0} (gamma * lam)^l * delta_{t+l}
    A~_t  = (A_t - mean_g(A)) / (std_g(A) + epsilon)   mean_std_norm, over all rows of group g
          =  A_t - mean_g(A)                          mean_norm

Choices where the sources are silent, each with its reason:

* ``r'_t`` is the reward implied by the step returns, so that the value proxy and the TD
  residuals describe the same return. With ``penalty_mode="in_reward"`` (or no invalid rows) it
  is exactly ``r_t``. With the reference code's ``after_discount`` penalty it is
  ``r_t - c*invalid_t + gamma*c*invalid_{t+1}``; this is what makes lam = 1 telescope to
  ``G'_t - V(s_t)`` in both penalty modes.
* V is pooled over every step of the group (any time index), like GiGPO's anchor groups.
* A state seen once has V = its own return (its TD error then carries no new information), the
  natural consequence of the mean; no special case.
* Normalisation runs over all step rows of the task group; ``mode`` picks z-score or
  mean-centring, with the same epsilon placement as GiGPO.

lam = 1 makes ``A_t = G'_t - V(s_t)``, GiGPO's step term with ``mode="mean_norm"``. Because V
is a mean within each anchor group and the anchor groups partition the task group, the group
mean of ``A`` is then 0, so GAGPO(lam = 1, mode = mean_norm) equals GiGPO's mean_norm step term
exactly. With mean_std_norm the two differ (GAGPO divides by the task group's std, GiGPO by each
anchor group's).

Action-level importance ratio: the learner should use one ratio per action,
``rho_t = exp(mean over the action's response tokens of (logp - logp_old))``, shared by all its
tokens. The estimator asks the learner for it through :meth:`GAGPO.loss_options`
(``action_level_ratio=True``, the default); ``agentrl.learner.losses.action_level_ratio`` computes it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from agentrl.data import StepBatch
from agentrl.estimators import common
from agentrl.estimators.base import Estimator, LossOptions
from agentrl.estimators.params import param, shared
from agentrl.estimators.registry import register_estimator


def grouped_value_proxy(step_return: np.ndarray, anchor: np.ndarray, num_anchor: int) -> np.ndarray:
    """V(s) per row: the mean step return of the rows in the row's anchor group (float64 numpy)."""
    total = np.bincount(anchor, step_return, minlength=num_anchor)
    return (total / np.maximum(np.bincount(anchor, minlength=num_anchor), 1))[anchor]


def gae_advantages(step_return: np.ndarray, value: np.ndarray, layout: common.TrajectoryLayout,
                   gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Raw GAE advantage and TD residual per row (before group normalisation; float64 numpy)."""
    implied_reward = step_return - gamma * layout.next_row_values_np(step_return)
    delta = implied_reward + gamma * layout.next_row_values_np(value) - value
    return layout.discounted_sum_np(delta, gamma * lam), delta


@register_estimator
class GAGPO(Estimator):
    name = "gagpo"
    title = "GAGPO"
    table_rank = 40

    @dataclasses.dataclass(frozen=True)
    class Params:
        gamma: float = shared("gamma")
        mode: str = shared("mode")
        epsilon: float = shared("epsilon")
        penalty_mode: str = shared("penalty_mode")
        lam: float = param(0.8, "GAE trace parameter lambda (1: Monte-Carlo)", min=0, max=1)
        action_level_ratio: bool = param(True, "the learner uses one length-normalised importance ratio per action, "
                                         "exp(mean token log-ratio), instead of one per token")

    def loss_options(self) -> LossOptions:
        return LossOptions(action_level_ratio=bool(self.params.action_level_ratio))

    def step_groups(self, batch: StepBatch, state=None) -> torch.Tensor:
        """The anchor-state groups whose mean step return is the value proxy V."""
        return common.anchor_segments(batch, common.group_segments(batch)[0])[0]

    def advantages(self, batch: StepBatch, state=None) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        layout = common.TrajectoryLayout.of(batch)
        returns = common.row_returns(batch, layout, p.gamma, p.penalty_mode)
        group, num_groups = common.group_segments(batch)
        anchor, num_anchor = common.anchor_segments(batch, group)
        step_return = returns.step_return.numpy()
        value = grouped_value_proxy(step_return, anchor.numpy(), num_anchor)
        raw, delta = gae_advantages(step_return, value, layout, p.gamma, p.lam)
        adv = common.normalise_in_segments(torch.from_numpy(raw), group, num_groups, p.mode == "mean_std_norm",
                                           p.epsilon, "keep")
        diagnostics = {
            "num_groups": float(num_groups),
            "num_state_groups": float(num_anchor),
            "state_singleton_rate": common.singleton_rate(anchor, num_anchor),
            "mean_state_group_size": common.mean_segment_size(anchor, num_anchor),
            "td_residual_abs_mean": float(np.abs(delta).mean()) if len(batch) else 0.0,
            "raw_advantage_std": float(raw.std(ddof=1)) if len(batch) > 1 else 0.0,
        }
        return torch.from_numpy(adv.numpy().astype(np.float32)), diagnostics
