"""The policy-loss interface: one class per loss, declaring everything the learner needs from it.

A policy loss turns the per-token log-probs of the current policy, the old (proximal) policy and the
advantages into one policy-gradient loss per trained token. Everything around it is shared and the
same for every loss (``agentrl.learner.losses.policy_loss``): the importance log-ratio (per token, or
the estimator's action-level ratio), the behaviour weight of the asynchronous modes
(``learner.rollout_is_cap``), the aggregation over tokens and steps (``learner.loss_agg_mode``, with
the learner's global denominator), the KL-to-reference and entropy terms and the metrics. Besides
the computation a loss declares:

* ``Params``: its own parameters (a frozen dataclass of :func:`~agentrl.estimators.params.param`
  fields): the config section ``learner.<name>`` (``learner.policy_loss_params`` for a loss loaded by
  import path), its help texts and docs/configuration.md are generated from it;
* ``ratio``: what importance ratio it uses: ``"token"`` (one per token, the ``log_ratio`` it is given:
  an estimator's action-level ratio replaces it), ``"sequence"`` (it forms one ratio per step itself,
  so an estimator's action-level request is already met) or ``"none"`` (no ratio: an estimator that
  asks for an action-level ratio is refused);
* ``default_agg_mode`` and ``agg_modes``: the aggregation used when ``learner.loss_agg_mode`` is null,
  and the ones it accepts (None: all);
* ``takes_behaviour_weight``: whether the behaviour weight may multiply its token losses (False: the
  asynchronous modes' correction is refused with it); :meth:`PolicyLoss.weigh` says how;
* ``metrics``: the names (and meaning) of the per-token metrics it reports beyond the common ones.

A minimal loss (docs/learner.md, "Add a policy loss")::

    from agentrl.policy_losses import LossTerms, PolicyLoss, param

    class ScaledPG(PolicyLoss):
        name = "scaled_pg"

        @dataclasses.dataclass(frozen=True)
        class Params:
            scale: float = param(1.0, "multiplies the loss", gt=0)

        def token_losses(self, x):
            return LossTerms(-self.params.scale * x.token_advantages() * x.logprobs)
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Optional

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "k2", "low_var_kl", "k3+", "abs")
RATIO_KINDS = ("token", "sequence", "none")
LOG_RATIO_CLAMP = 20.0     # verl clamps log-ratios to [-20, 20] before exp


@dataclasses.dataclass(frozen=True)
class NoParams:
    """A loss without parameters of its own."""


@dataclasses.dataclass
class LossInputs:
    """What a loss is given for one micro-batch (``N`` steps, ``R`` response tokens, right-padded).

    ``log_ratio`` is ``log pi - log pi_old`` clamped to [-20, 20], per token, or (loss ``ratio="token"``
    and an estimator that asks for it) the step's action-level log-ratio on each of its tokens.
    ``clip_ratio_low``, ``clip_ratio_high`` and ``dual_clip_c`` are the ``learner.*`` keys of the same
    names, for the losses that clip.
    """

    logprobs: torch.Tensor           # [N, R] current policy (carries the gradient)
    old_logprobs: torch.Tensor       # [N, R] old (proximal) policy
    advantages: torch.Tensor         # [N] (one per step) or [N, R]
    mask: torch.Tensor               # [N, R] 1 for trained tokens, in the log-probs' dtype
    log_ratio: torch.Tensor          # [N, R]
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    dual_clip_c: float = 0.0

    def token_advantages(self) -> torch.Tensor:
        """The advantages as [N, R] in the log-probs' dtype."""
        adv = self.advantages.unsqueeze(1) if self.advantages.dim() == 1 else self.advantages
        return adv.to(self.logprobs.dtype).expand_as(self.logprobs)


@dataclasses.dataclass
class LossTerms:
    """A loss's per-token result: ``losses`` [N, R] (padding may hold anything: it is masked), where its
    clip bit (``clipped``: the upper or only clip, ``clipped_lower``: a second one such as the dual
    clip; bool or 0/1, None = never), the ratio it used (``ratio`` [N, R], for ``ratio_mean/max/min``;
    None = ``exp(log_ratio)``) and its own per-token ``metrics`` (reported as means over trained tokens,
    names declared in ``PolicyLoss.metrics``)."""

    losses: torch.Tensor
    clipped: Optional[torch.Tensor] = None
    clipped_lower: Optional[torch.Tensor] = None
    ratio: Optional[torch.Tensor] = None
    metrics: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


class PolicyLoss(abc.ABC):
    """Base class of every policy loss (built in or a user's, loaded by import path)."""

    name: ClassVar[str] = ""                       # registry key and config section: learner.<name>
    title: ClassVar[str] = ""                      # how docs and tables name it
    source: ClassVar[str] = ""                     # the paper (one line, for the docs)
    table_rank: ClassVar[int] = 1000               # order in lists and docs (smaller first)
    Params: ClassVar[type] = NoParams              # frozen dataclass of param() fields
    ratio: ClassVar[str] = "token"                 # one of RATIO_KINDS
    default_agg_mode: ClassVar[str] = "token-mean"
    agg_modes: ClassVar[Optional[tuple[str, ...]]] = None
    takes_behaviour_weight: ClassVar[bool] = True
    metrics: ClassVar[dict[str, str]] = {}         # its own per-token metrics: name -> meaning

    def __init__(self, params: Any = None):
        self.params = params if params is not None else self.Params()

    @abc.abstractmethod
    def token_losses(self, x: LossInputs) -> LossTerms:
        """The per-token policy-gradient losses of one micro-batch (before the behaviour weight and
        the aggregation)."""

    def weigh(self, losses: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``losses`` with the behaviour weight [N, R] (a constant) applied: per token by default."""
        return losses * weight.to(losses.dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"


# ------------------------------------------------------------------------------- tensor pieces
def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the tokens where ``mask`` is 1 (0 when there are none)."""
    mask = mask.to(values.dtype)
    masked = torch.where(mask > 0, values, torch.zeros_like(values)) * mask
    total = float(mask.sum())
    return masked.sum() / total if total > 0 else masked.sum() * 0.0


def advantage_logprob_covariance(advantages: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor
                                 ) -> torch.Tensor:
    """Per token, ``(A - mean A)(log pi - mean log pi)``, the means over the trained tokens: the
    covariance Clip-Cov and KL-Cov pick their tokens by (no gradient)."""
    with torch.no_grad():
        return (advantages - masked_mean(advantages, mask)) * (logprobs - masked_mean(logprobs, mask))


def row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per row: the mean of ``values`` over its trained tokens (0 for a row without any)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)


def ppo_clip_token_losses(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_ratio_low: float,
                          clip_ratio_high: float, dual_clip_c: float = 0.0
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO-clip per-token losses and two indicator tensors (clipped, dual-clipped).

    ``loss = max(-A r, -A clip(r, 1 - low, 1 + high))``; with dual clip (c > 1) and ``A < 0`` the
    loss is further capped at ``-A c`` (so a huge ratio on a negative advantage cannot explode).
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    adv = adv.to(log_ratio.dtype).expand_as(log_ratio)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped).to(log_ratio.dtype)
    if dual_clip_c and dual_clip_c > 0:
        cap = -adv * dual_clip_c
        dual_clipped = ((loss > cap) & (adv < 0)).to(log_ratio.dtype)
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)
    else:
        dual_clipped = torch.zeros_like(loss)
    return loss, was_clipped, dual_clipped


__all__ = ["AGG_MODES", "KL_TYPES", "LOG_RATIO_CLAMP", "LossInputs", "LossTerms", "NoParams", "PolicyLoss",
           "RATIO_KINDS", "masked_mean", "ppo_clip_token_losses", "row_mean"]
