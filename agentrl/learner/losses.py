"""Policy-optimisation losses: small pure tensor functions (no model, no DeepSpeed).

Shapes: ``logprobs``, ``old_logprobs``, ``ref_logprobs``, ``response_mask`` are ``[N, R]`` (N step
records, R response tokens, right-padded); ``advantages`` is ``[N]`` (one value per step record,
broadcast over its tokens) or ``[N, R]``. Formulas, and where they follow verl, in docs/learner.md.

The policy-gradient term itself is a plug-in (``learner.policy_loss``, :mod:`agentrl.policy_losses`:
dual-clip PPO by default); :func:`policy_loss` is the part every loss shares.

Aggregation and global normalisation
------------------------------------
A loss is a masked sum of per-token terms divided by a *denominator*: the number of trained tokens
(``token-mean``) or the number of step records that have at least one trained token (the
``seq-mean-*`` modes). Called on one micro-batch with ``denominator=None`` that is exactly verl's
``agg_loss``. The learner instead passes the denominator of the whole mini-batch (summed over its
micro-batches and over all ranks), so the gradients accumulated over micro-batches and averaged
over ranks equal the gradient of one loss over the whole mini-batch, whatever the split.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import torch

from agentrl.policy_losses import (AGG_MODES, DEFAULT, KL_TYPES, LOG_RATIO_CLAMP, LossInputs, PolicyLoss,
                                   build_policy_loss, check_composition, policy_loss_class, policy_loss_values,
                                   ppo_clip_token_losses, resolve_agg_mode)

LOW_VAR_KL_CLAMP = 10.0    # verl clamps the low_var_kl value to [-10, 10]
# Metrics that are partial sums when a global denominator is passed: they add up over micro-batches
# and ranks to the mini-batch value. The other metrics are means over the call's trained tokens.
ADDITIVE_METRICS = ("loss", "pg_loss", "kl_ref", "entropy")


DEFAULT_BEHAVIOUR_CAP = 2.0     # learner.rollout_is_cap=null with trainer.mode one_step_off or async


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The loss hyper-parameters (``learner.*`` in the config plus the estimator's ratio choice).

    ``policy_loss`` names the policy-gradient loss (a built-in name or ``package.module:Class``) and
    ``loss_params`` its own parameter values; ``loss_agg_mode=None`` is the loss's own default. A loss
    that cannot take the estimator's action-level ratio or the behaviour weight is refused here.
    ``loss_scale_factor`` is the constant ``seq-mean-token-sum-norm`` divides each step's token sum by
    (0: the padded response length of the call, as verl)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    dual_clip_c: float = 3.0
    loss_agg_mode: Optional[str] = None
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0
    action_level_ratio: bool = False
    rollout_is_cap: float = 0.0
    policy_loss: str = DEFAULT
    loss_params: Optional[dict[str, Any]] = dataclasses.field(default=None, compare=False)
    loss_scale_factor: float = 0.0

    def __post_init__(self) -> None:
        cls = policy_loss_class(self.policy_loss)
        object.__setattr__(self, "loss_agg_mode", resolve_agg_mode(cls, self.loss_agg_mode))
        check_composition(cls, action_level_ratio=self.action_level_ratio, behaviour_weight=self.rollout_is_cap > 0)
        if self.loss_scale_factor < 0:
            raise ValueError(f"loss_scale_factor must be 0 (the padded length) or positive, got {self.loss_scale_factor}")
        if self.kl_type not in KL_TYPES:
            raise ValueError(f"kl_type must be one of {KL_TYPES}, got {self.kl_type!r}")
        if self.dual_clip_c != 0 and self.dual_clip_c <= 1:
            raise ValueError(f"dual_clip_c must be 0 (off) or greater than 1, got {self.dual_clip_c}")
        if self.rollout_is_cap != 0 and self.rollout_is_cap < 1:
            raise ValueError(f"rollout_is_cap must be 0 (off) or at least 1, got {self.rollout_is_cap}")
        self.loss  # noqa: B018 -- built now, so a bad loss parameter is refused here, not at the first step

    @functools.cached_property
    def loss(self) -> PolicyLoss:
        """The policy-gradient loss, built once."""
        return build_policy_loss(self.policy_loss, self.loss_params)

    @property
    def loss_metrics(self) -> tuple[str, ...]:
        """The per-token metrics the loss reports beyond the common ones (token-weighted means)."""
        return tuple(self.loss.metrics)

    @classmethod
    def from_config(cls, learner_cfg, action_level_ratio: bool = False, rollout_runs_ahead: bool = False,
                    response_budget: int = 0) -> "LossSettings":
        """``learner.*``; ``loss_scale_factor=0`` is ``response_budget`` (``rollout.max_response_tokens``)
        when given; ``rollout_is_cap=null`` is 0 (off) when the rollout never runs ahead of the learner
        (``trainer.mode=sync``) and 2 when it does (the behaviour weight of the decoupled objective,
        docs/async.md; ``TrainingMode.overlapped``)."""
        cap = learner_cfg.rollout_is_cap
        if cap is None:
            cap = DEFAULT_BEHAVIOUR_CAP if rollout_runs_ahead else 0.0
        spec = getattr(learner_cfg, "policy_loss", DEFAULT)
        scale = getattr(learner_cfg, "loss_scale_factor", 0) or response_budget
        return cls(clip_ratio_low=learner_cfg.clip_ratio_low, clip_ratio_high=learner_cfg.clip_ratio_high,
                   dual_clip_c=learner_cfg.dual_clip_c, loss_agg_mode=learner_cfg.loss_agg_mode,
                   kl_coef=learner_cfg.kl_coef, kl_type=learner_cfg.kl_type, entropy_coef=learner_cfg.entropy_coef,
                   action_level_ratio=action_level_ratio, rollout_is_cap=float(cap), policy_loss=spec,
                   loss_params=policy_loss_values(learner_cfg), loss_scale_factor=float(scale))


@dataclasses.dataclass
class LossOutput:
    """``loss`` to back-propagate, its parts as floats, and whether the inputs were all finite.

    When ``finite`` is False the loss must not be back-propagated (the learner skips the step).
    ``num_tokens`` weights ``metrics`` when the learner averages them over micro-batches.
    """

    loss: torch.Tensor
    metrics: dict[str, float]
    finite: bool
    num_tokens: float
    clipped: Optional[torch.Tensor] = None      # bool [N, R]: the token's PPO term was clipped
    capped: Optional[torch.Tensor] = None       # bool [N, R]: its behaviour weight was truncated at the cap


# ----------------------------------------------------------------------------------- aggregation
def _token_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.to(like.dtype)


def loss_denominator(response_mask: torch.Tensor, mode: str) -> float:
    """What ``aggregate`` divides by for this mask: trained tokens, or rows with a trained token."""
    if mode == "token-mean":
        return float(response_mask.sum())
    if mode in AGG_MODES:
        return float((response_mask.sum(dim=1) > 0).sum())
    raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {mode!r}")


def aggregate(values: torch.Tensor, response_mask: torch.Tensor, mode: str,
              denominator: Optional[float] = None, scale: float = 0.0) -> torch.Tensor:
    """Reduce per-token ``values`` [N, R] to a scalar (verl's ``agg_loss``).

    * ``token-mean``: sum over all trained tokens / number of trained tokens;
    * ``seq-mean-token-mean``: per row the mean over its trained tokens, then the mean over rows;
    * ``seq-mean-token-sum``: per row the sum over its trained tokens, then the mean over rows;
    * ``seq-mean-token-sum-norm`` (Dr. GRPO): per row the sum over its trained tokens divided by the
      constant ``scale`` (0: the padded length R), then the mean over rows.

    Rows without trained tokens are left out of the seq means. ``denominator`` replaces the
    local count (see the module docstring); a zero denominator gives a zero loss.
    """
    mask = _token_mask(response_mask, values)
    masked = torch.where(mask > 0, values, torch.zeros_like(values)) * mask
    if mode == "token-mean":
        numerator = masked.sum()
    elif mode == "seq-mean-token-mean":
        numerator = (masked.sum(dim=1) / mask.sum(dim=1).clamp_min(1)).sum()
    elif mode == "seq-mean-token-sum":
        numerator = masked.sum()
    elif mode == "seq-mean-token-sum-norm":
        numerator = masked.sum() / (scale if scale > 0 else values.shape[-1])
    else:
        raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {mode!r}")
    denom = loss_denominator(response_mask, mode) if denominator is None else float(denominator)
    return numerator / denom if denom > 0 else numerator * 0.0


def masked_mean(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return aggregate(values, response_mask, "token-mean")


# ------------------------------------------------------------------------------------ components
def action_level_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor
                           ) -> torch.Tensor:
    """Per row: mean over the trained response tokens of ``logprobs - old_logprobs`` (0 if none)."""
    mask = response_mask.to(logprobs.dtype)
    return ((logprobs - old_logprobs) * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)


def action_level_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor
                       ) -> torch.Tensor:
    """Per row: the length-normalised (geometric-mean) importance ratio of the whole action
    (what an estimator asks for with ``LossOptions.action_level_ratio``)."""
    return torch.exp(action_level_log_ratio(logprobs, old_logprobs, response_mask))


def importance_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor,
                         action_level: bool = False) -> torch.Tensor:
    """Per-token log importance ratio [N, R], clamped to [-20, 20].

    With ``action_level`` every token of a row gets the row's length-normalised log-ratio (the
    mean over its trained tokens: the action-level ratio an estimator asks for with
    ``LossOptions.action_level_ratio``).
    """
    if action_level:
        per_row = action_level_log_ratio(logprobs, old_logprobs, response_mask)
        log_ratio = per_row.unsqueeze(1).expand_as(logprobs)
    else:
        log_ratio = logprobs - old_logprobs
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def rollout_is_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance-sampling weights [N, R] for the rollout/learner mismatch, and where the cap bit.

    The rollout backend sampled from its own numerics (bf16 vLLM, say), so the tokens come from
    ``pi_rollout``, not ``pi_old``. Each sampled token's policy-gradient term is weighted by
    ``min(pi_old / pi_rollout, cap)`` (Yao et al., 2025, "truncated importance sampling"; verl's
    ``tis_imp_ratio_cap``). The weight is a constant (no gradient); the log-ratio is clamped to
    [-20, 20] before the exponential.
    """
    ratio = torch.exp((old_logprobs - rollout_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
    capped = ratio > cap
    return ratio.clamp(max=cap), capped


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs (verl's ``kl_penalty``).

    * ``k1``: ``log p - log p_ref``;
    * ``k2``: ``0.5 (log p - log p_ref)^2``;
    * ``low_var_kl`` (Schulman's k3): ``exp(d) - d - 1`` with ``d = log p_ref - log p`` clamped
      to [-20, 20], the result clamped to [-10, 10];
    * ``k3+``: the value of ``low_var_kl`` with the gradient of ``k2`` (straight through: k2's
      gradient is an unbiased estimate of the KL's gradient, k3's is not);
    * ``abs``: ``|log p - log p_ref|``.
    """
    if kl_type == "k1":
        return logprobs - ref_logprobs
    if kl_type == "k2":
        return 0.5 * (logprobs - ref_logprobs).square()
    if kl_type == "abs":
        return (logprobs - ref_logprobs).abs()
    if kl_type in ("low_var_kl", "k3+"):
        d = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        value = (torch.exp(d) - d - 1.0).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)
        if kl_type == "low_var_kl":
            return value
        k2 = 0.5 * (logprobs - ref_logprobs).square()
        return k2 - k2.detach() + value.detach()
    raise ValueError(f"kl_type must be one of {KL_TYPES}, got {kl_type!r}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: ``logsumexp(z) - sum softmax(z) z``."""
    logits = logits.float()
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``tokens`` [..., T] under ``logits`` [..., T, V] (float32)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def inputs_finite(response_mask: torch.Tensor, advantages: torch.Tensor, *logprob_tensors: Optional[torch.Tensor]) -> bool:
    """True when every trained token's log-probs and every advantage are finite (padding ignored)."""
    trained = response_mask > 0
    adv = advantages.unsqueeze(1).expand_as(response_mask) if advantages.dim() == 1 else advantages
    if not bool(torch.isfinite(adv[trained]).all()):
        return False
    for tensor in logprob_tensors:
        if tensor is not None and not bool(torch.isfinite(tensor[trained]).all()):
            return False
    return True


def _indicator(flags: Optional[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """A loss's clip bits as 0/1 in the mask's dtype (zeros when it has none)."""
    return torch.zeros_like(mask) if flags is None else flags.detach().to(mask.dtype)


# ------------------------------------------------------------------------------------ full loss
def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, settings: LossSettings, ref_logprobs: Optional[torch.Tensor] = None,
                entropy: Optional[torch.Tensor] = None, denominator: Optional[float] = None,
                rollout_logprobs: Optional[torch.Tensor] = None) -> LossOutput:
    """``pg_loss + kl_coef * kl_loss - entropy_coef * entropy`` and its metrics; ``pg_loss`` is the
    configured policy loss's token losses (``settings.loss``), times the behaviour weight, aggregated.

    ``entropy`` is the per-token entropy [N, R] (:func:`entropy_from_logits`); it is needed when
    ``entropy_coef > 0`` and reported when given. ``ref_logprobs`` is needed when ``kl_coef > 0``.
    ``rollout_logprobs`` (what the rollout backend reported for the sampled tokens) is needed when
    ``rollout_is_cap > 0``: the per-token policy-gradient losses are then weighted by
    :func:`rollout_is_weights` (tokens nothing sampled, such as an expert's, should carry their
    ``old_logprobs`` here, which gives them weight 1).
    Non-finite log-probs or advantages on trained tokens give ``finite=False`` and a zero loss
    with no graph: the caller must skip the step.
    """
    if settings.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (the frozen reference model's log-probs)")
    if settings.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs the per-token entropy (entropy_from_logits)")
    if settings.rollout_is_cap > 0 and rollout_logprobs is None:
        raise ValueError("rollout_is_cap > 0 needs rollout_logprobs (the rollout backend's log-probs)")
    mask = response_mask.to(logprobs.dtype)
    num_tokens = float(mask.sum())
    if not inputs_finite(response_mask, advantages, logprobs, old_logprobs,
                         ref_logprobs if settings.kl_coef > 0 else None):
        return LossOutput(torch.zeros((), dtype=logprobs.dtype), {"nonfinite_inputs": 1.0}, False, num_tokens)

    mode, scale, loss_fn = settings.loss_agg_mode, settings.loss_scale_factor, settings.loss
    log_ratio = importance_log_ratio(logprobs, old_logprobs, mask,
                                     settings.action_level_ratio and loss_fn.ratio == "token")
    terms = loss_fn.token_losses(LossInputs(logprobs, old_logprobs, advantages, mask, log_ratio,
                                            settings.clip_ratio_low, settings.clip_ratio_high, settings.dual_clip_c))
    token_loss = terms.losses
    is_metrics = {"rollout_is_weight": 1.0, "rollout_is_capped": 0.0}     # off: every weight is 1
    capped = None
    if settings.rollout_is_cap > 0:
        is_weight, capped = rollout_is_weights(old_logprobs, rollout_logprobs.to(old_logprobs.dtype),
                                               settings.rollout_is_cap)
        token_loss = loss_fn.weigh(token_loss, is_weight, mask)
        is_metrics = {"rollout_is_weight": float(masked_mean(is_weight.to(mask.dtype), mask)),
                      "rollout_is_capped": float(masked_mean(capped.to(mask.dtype), mask))}
    pg_loss = aggregate(token_loss, mask, mode, denominator, scale)
    loss = pg_loss
    metrics: dict[str, float] = {}
    was_clipped = _indicator(terms.clipped, mask)
    with torch.no_grad():
        trained = mask > 0
        ratio = (torch.exp(log_ratio) if terms.ratio is None else terms.ratio.to(mask.dtype))[trained]
        metrics.update(
            pg_loss=float(pg_loss.detach()),
            pg_clipfrac=float(masked_mean(was_clipped, mask)),
            pg_clipfrac_lower=float(masked_mean(_indicator(terms.clipped_lower, mask), mask)),
            # verl's ppo_kl: the k1 estimate of KL(pi_old || pi) on the sampled tokens
            approx_kl=float(masked_mean(old_logprobs - logprobs, mask)),
            ratio_mean=float(ratio.mean()) if ratio.numel() else 1.0,
            ratio_max=float(ratio.max()) if ratio.numel() else 1.0,
            ratio_min=float(ratio.min()) if ratio.numel() else 1.0,
            **is_metrics,
        )
        for name in loss_fn.metrics:
            metrics[name] = float(masked_mean(terms.metrics[name].detach().to(mask.dtype), mask))
    if ref_logprobs is not None:
        kl_loss = aggregate(kl_penalty(logprobs, ref_logprobs.to(logprobs.dtype), settings.kl_type), mask, mode,
                            denominator, scale)
        if settings.kl_coef > 0:
            loss = loss + settings.kl_coef * kl_loss
        metrics["kl_ref"] = float(kl_loss.detach())
    if entropy is not None:
        entropy_term = aggregate(entropy.to(logprobs.dtype), mask, mode, denominator, scale)
        if settings.entropy_coef > 0:
            loss = loss - settings.entropy_coef * entropy_term
        metrics["entropy"] = float(entropy_term.detach())
    metrics["loss"] = float(loss.detach())
    return LossOutput(loss, metrics, True, num_tokens, clipped=was_clipped.detach() > 0,
                      capped=capped.detach() if capped is not None else None)
