"""GSPO, group sequence policy optimisation (Zheng et al., 2025, arXiv:2507.18071), in its token form as
verl's ``compute_policy_loss_gspo``: one length-normalised ratio per step, clipped."""

from __future__ import annotations

import torch

from agentrl.policy_losses.base import LossInputs, LossTerms, PolicyLoss, row_mean
from agentrl.policy_losses.registry import register_policy_loss

LOG_RATIO_MAX = 10.0     # verl clamps the step's log-ratio from above before exp


@register_policy_loss
class GSPO(PolicyLoss):
    """``s_i = exp(mean_t (log pi - log pi_old))`` per step; per token ``s_it = sg[s_i] pi_t / sg[pi_t]``
    (the value ``s_i``, the gradient ``s_i grad log pi_t``); ``l = max(-A s_it, -A clip(s_it, 1 - low,
    1 + high))``. The paper's clip range is 3e-4 / 4e-4 (``learner.clip_ratio_low/high``)."""

    name = "gspo"
    table_rank = 1
    title = "GSPO"
    source = "Zheng et al. 2025, Group Sequence Policy Optimization (arXiv:2507.18071)"
    ratio = "sequence"
    default_agg_mode = "seq-mean-token-mean"

    def token_losses(self, x: LossInputs) -> LossTerms:
        delta = torch.where(x.mask > 0, x.logprobs - x.old_logprobs, torch.zeros_like(x.logprobs))
        step_log_ratio = row_mean(delta, x.mask)
        log_ratio = x.logprobs - x.logprobs.detach() + step_log_ratio.detach().unsqueeze(1)
        ratio = torch.exp(log_ratio.clamp(max=LOG_RATIO_MAX))
        adv = x.token_advantages()
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1.0 - x.clip_ratio_low, 1.0 + x.clip_ratio_high)
        return LossTerms(torch.maximum(unclipped, clipped), clipped=clipped > unclipped, ratio=ratio.detach())
