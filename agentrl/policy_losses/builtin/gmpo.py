"""GMPO, geometric-mean policy optimisation (Zhao et al., 2025, arXiv:2507.20673), as verl's
``compute_policy_loss_geo_mean``: one ratio per step, the geometric mean of its clipped token ratios."""

from __future__ import annotations

import torch

from agentrl.policy_losses.base import LossInputs, LossTerms, PolicyLoss, row_mean
from agentrl.policy_losses.registry import register_policy_loss

WEIGHT_LOG_FLOOR = 1e-10     # verl: log(w + 1e-10) when it averages the behaviour weights of a step


@register_policy_loss
class GMPO(PolicyLoss):
    """Per token ``d_t = log pi - log pi_old`` clipped to [-low, high] on the side the advantage's sign
    pushes (``sgn(A) min(sgn(A) d, sgn(A) clip(d))``); per step ``L_i = -mean_t(A) exp(mean_t d_t)``;
    the loss is the mean of ``L_i`` over the steps (``loss_agg_mode`` seq-mean-token-mean only). The
    behaviour weight of a step is the geometric mean of its tokens' weights."""

    name = "gmpo"
    table_rank = 6
    title = "GMPO (geometric mean)"
    source = "Zhao et al. 2025, Geometric-Mean Policy Optimization (arXiv:2507.20673)"
    ratio = "sequence"
    default_agg_mode = "seq-mean-token-mean"
    agg_modes = ("seq-mean-token-mean",)

    def token_losses(self, x: LossInputs) -> LossTerms:
        log_ratio = x.log_ratio
        adv = x.token_advantages()
        sign = torch.sign(adv)
        bounded = log_ratio.clamp(-x.clip_ratio_low, x.clip_ratio_high)
        chosen = sign * torch.min(sign * log_ratio, sign * bounded)
        step_ratio = torch.exp(row_mean(chosen, x.mask))
        step_loss = -row_mean(adv, x.mask) * step_ratio
        was_clipped = log_ratio != bounded
        # one value per step on each of its tokens: the seq-mean-token-mean of it is the mean of L_i
        return LossTerms(step_loss.unsqueeze(1).expand_as(log_ratio), clipped=was_clipped & (adv > 0),
                         clipped_lower=was_clipped & (adv < 0), ratio=step_ratio.detach().unsqueeze(1).expand_as(adv))

    def weigh(self, losses: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        step_weight = torch.exp(row_mean(torch.log(weight.to(losses.dtype) + WEIGHT_LOG_FLOOR), mask))
        return losses * step_weight.unsqueeze(1)
