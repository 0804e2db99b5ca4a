"""KL-Cov (Cui et al., 2025, arXiv:2505.22617), as verl's ``compute_policy_loss_kl_cov``: the unclipped
policy gradient, with a KL penalty ``|log r|`` on the tokens whose advantage and log-prob covary most."""

from __future__ import annotations

import dataclasses

import torch

from agentrl.estimators.params import param
from agentrl.policy_losses.base import LossInputs, LossTerms, PolicyLoss, advantage_logprob_covariance
from agentrl.policy_losses.registry import register_policy_loss


@register_policy_loss
class KLCov(PolicyLoss):
    """``l = -A r``, plus ``ppo_kl_coef |log r|`` on the ``max(1, floor(kl_cov_ratio n))`` trained tokens
    (of the micro-batch's ``n``) with the largest ``(A - mean A)(log pi - mean log pi)``. No clip."""

    name = "kl_cov"
    table_rank = 5
    title = "KL-Cov"
    source = "Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs (arXiv:2505.22617)"
    metrics = {"kl_cov_frac": "share of the trained tokens that carry KL-Cov's penalty"}

    @dataclasses.dataclass(frozen=True)
    class Params:
        kl_cov_ratio: float = param(0.0002, "share of the micro-batch's trained tokens that get the KL penalty",
                                    gt=0, max=1)
        ppo_kl_coef: float = param(0.1, "coefficient of the penalty |log pi - log pi_old|", min=0)

    def token_losses(self, x: LossInputs) -> LossTerms:
        p = self.params
        ratio = torch.exp(x.log_ratio)
        adv = x.token_advantages()
        plain = -adv * ratio
        penalised = plain + p.ppo_kl_coef * x.log_ratio.abs()
        trained = (x.mask > 0).reshape(-1)
        selected = torch.zeros_like(trained)
        with torch.no_grad():
            positions = torch.nonzero(trained, as_tuple=True)[0]
            if len(positions):
                cov = advantage_logprob_covariance(adv, x.logprobs, x.mask).reshape(-1)[positions]
                top = torch.topk(cov, max(1, int(len(cov) * p.kl_cov_ratio)), largest=True).indices
                selected[positions[top]] = True
        selected = selected.view_as(adv)
        losses = torch.where(selected, penalised, plain)
        return LossTerms(losses, metrics={"kl_cov_frac": selected.to(adv.dtype)})
