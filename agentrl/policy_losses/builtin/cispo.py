"""CISPO, clipped importance-sampling policy optimisation (MiniMax, 2025, arXiv:2506.13585), as verl's
``compute_policy_loss_cispo``: the clipped ratio is a constant weight, every token keeps its gradient."""

from __future__ import annotations

import torch

from agentrl.policy_losses.base import LossInputs, LossTerms, PolicyLoss
from agentrl.policy_losses.registry import register_policy_loss


@register_policy_loss
class CISPO(PolicyLoss):
    """``l = -sg[clip(r, 1 - low, 1 + high)] A log pi``: unlike PPO, a token whose ratio left the range
    still contributes its gradient, scaled by the bound."""

    name = "cispo"
    table_rank = 7
    title = "CISPO"
    source = "MiniMax 2025, MiniMax-M1 (arXiv:2506.13585)"

    def token_losses(self, x: LossInputs) -> LossTerms:
        ratio = torch.exp(x.log_ratio)
        weight = ratio.clamp(1.0 - x.clip_ratio_low, 1.0 + x.clip_ratio_high)
        losses = -weight.detach() * x.token_advantages() * x.logprobs
        return LossTerms(losses, clipped=ratio != weight)
