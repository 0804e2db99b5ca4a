"""Dual-clip PPO (Schulman et al., 2017, arXiv:1707.06347; dual clip: Ye et al., 2020, arXiv:1912.09729),
as verl's ``compute_policy_loss_vanilla``: the default loss."""

from __future__ import annotations

from agentrl.policy_losses.base import LossInputs, LossTerms, PolicyLoss, ppo_clip_token_losses
from agentrl.policy_losses.registry import register_policy_loss


@register_policy_loss
class Vanilla(PolicyLoss):
    """``l = max(-A r, -A clip(r, 1 - low, 1 + high))``, capped at ``-A c`` where ``A < 0`` (``c`` =
    ``learner.dual_clip_c``, 0 = no cap)."""

    name = "vanilla"
    table_rank = 0
    title = "PPO (dual clip)"
    source = "Schulman et al. 2017 (arXiv:1707.06347); dual clip: Ye et al. 2020 (arXiv:1912.09729)"

    def token_losses(self, x: LossInputs) -> LossTerms:
        losses, clipped, dual_clipped = ppo_clip_token_losses(x.log_ratio, x.advantages, x.clip_ratio_low,
                                                              x.clip_ratio_high, x.dual_clip_c)
        return LossTerms(losses, clipped=clipped, clipped_lower=dual_clipped)
