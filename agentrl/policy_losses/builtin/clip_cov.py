"""Clip-Cov (Cui et al., 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617), as verl's ``compute_policy_loss_clip_cov``: PPO-clip, and the gradient of a
few tokens whose advantage and log-prob covary most is cut (entropy collapse comes from them)."""

from __future__ import annotations

import dataclasses

import torch

from agentrl.estimators.params import param
from agentrl.policy_losses.base import LossInputs, LossTerms, PolicyLoss, advantage_logprob_covariance
from agentrl.policy_losses.registry import register_policy_loss


@register_policy_loss
class ClipCov(PolicyLoss):
    """``l = max(-A r, -A clip(r, 1 - low, 1 + high)) * c`` with ``c = 0`` on up to ``clip_cov_ratio`` of the
    micro-batch's trained tokens (at least one), drawn at random among the unclipped ones whose
    ``cov = (A - mean A) (log pi - mean log pi)`` lies in (``clip_cov_lb``, ``clip_cov_ub``), else 1.
    The means and the count are over the micro-batch, as in verl; the draw uses torch's global
    generator (seeded by ``trainer.seed``)."""

    name = "clip_cov"
    table_rank = 4
    title = "Clip-Cov"
    source = "Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs (arXiv:2505.22617)"
    metrics = {"clip_cov_frac": "share of the trained tokens whose gradient Clip-Cov cut"}

    @dataclasses.dataclass(frozen=True)
    class Params:
        clip_cov_ratio: float = param(0.0002, "share of the micro-batch's trained tokens whose gradient is cut",
                                      gt=0, max=1)
        clip_cov_lb: float = param(1.0, "a token is a candidate when its covariance exceeds this")
        clip_cov_ub: float = param(5.0, "a token is a candidate when its covariance is below this (and above clip_cov_lb)")

    def token_losses(self, x: LossInputs) -> LossTerms:
        p = self.params
        ratio = torch.exp(x.log_ratio)
        adv = x.token_advantages()
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1.0 - x.clip_ratio_low, 1.0 + x.clip_ratio_high)
        trained = x.mask > 0
        clipped_by_ppo = (clipped > unclipped) & trained
        with torch.no_grad():
            cov = advantage_logprob_covariance(adv, x.logprobs, x.mask)
            candidates = torch.nonzero((cov < p.clip_cov_ub) & (cov > p.clip_cov_lb) & trained & ~clipped_by_ppo)
            count = max(int(p.clip_cov_ratio * float(x.mask.sum())), 1)
            if len(candidates):
                candidates = candidates[torch.randperm(len(candidates))[:min(count, len(candidates))]]
            keep = torch.ones_like(adv)
            keep[candidates[:, 0], candidates[:, 1]] = 0.0
        losses = torch.maximum(unclipped, clipped) * keep
        return LossTerms(losses, clipped=clipped_by_ppo, metrics={"clip_cov_frac": (keep == 0).to(adv.dtype)})
