"""GPG, group policy gradient (Chu et al., 2025, arXiv:2504.02546), as verl's ``compute_policy_loss_gpg``:
plain REINFORCE on the sampled tokens, no ratio and no clip."""

from __future__ import annotations

from agentrl.policy_losses.base import LossInputs, LossTerms, PolicyLoss
from agentrl.policy_losses.registry import register_policy_loss


@register_policy_loss
class GPG(PolicyLoss):
    """``l = -A log pi``: no importance ratio, so one update per batch is on-policy only
    (``learner.ppo_epochs=1`` and one mini-batch); an estimator's action-level ratio is refused."""

    name = "gpg"
    table_rank = 3
    title = "GPG"
    source = "Chu et al. 2025, GPG: A Simple and Strong Reinforcement Learning Baseline (arXiv:2504.02546)"
    ratio = "none"

    def token_losses(self, x: LossInputs) -> LossTerms:
        return LossTerms(-x.logprobs * x.token_advantages())
