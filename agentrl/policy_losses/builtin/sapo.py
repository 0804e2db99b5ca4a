"""SAPO, soft adaptive policy optimisation (2025, arXiv:2511.20347), as verl's
``compute_policy_loss_sapo``: a smooth gate in place of the clip."""

from __future__ import annotations

import dataclasses

import torch

from agentrl.estimators.params import param
from agentrl.policy_losses.base import LossInputs, LossTerms, PolicyLoss
from agentrl.policy_losses.registry import register_policy_loss


@register_policy_loss
class SAPO(PolicyLoss):
    """``l = -A (4 / tau) sigmoid(tau (r - 1))`` with ``tau = tau_pos`` where ``A > 0``, else ``tau_neg``:
    its gradient weight ``4 p (1 - p) r`` (``p`` the sigmoid) is ``r`` near ``r = 1`` and fades away
    from it instead of stopping at a clip boundary."""

    name = "sapo"
    table_rank = 2
    title = "SAPO"
    source = "Soft Adaptive Policy Optimization, 2025 (arXiv:2511.20347)"
    default_agg_mode = "seq-mean-token-mean"
    metrics = {"sapo_grad_weight": "mean gradient weight 4 p (1 - p) r of the trained tokens (r on PPO's "
                                   "unclipped tokens; lower = more tokens gated off)"}

    @dataclasses.dataclass(frozen=True)
    class Params:
        tau_pos: float = param(1.0, "gate temperature of tokens with a positive advantage", gt=0)
        tau_neg: float = param(1.05, "gate temperature of tokens with a zero or negative advantage (above tau_pos: "
                               "negative updates fade faster)", gt=0)

    def token_losses(self, x: LossInputs) -> LossTerms:
        ratio = torch.exp(x.log_ratio)
        adv = x.token_advantages()
        tau = torch.where(adv > 0, torch.as_tensor(self.params.tau_pos, dtype=adv.dtype, device=adv.device),
                          torch.as_tensor(self.params.tau_neg, dtype=adv.dtype, device=adv.device))
        gate_p = torch.sigmoid(tau * (ratio - 1.0))
        losses = -(gate_p * (4.0 / tau)) * adv
        weight = (4.0 * gate_p * (1.0 - gate_p) * ratio).detach()
        return LossTerms(losses, metrics={"sapo_grad_weight": weight})
