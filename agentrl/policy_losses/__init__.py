"""Policy losses: one class per loss (:class:`PolicyLoss`), built-in ones found by discovery in
:mod:`agentrl.policy_losses.builtin` (one module each), a user's by import path
(``learner.policy_loss=my_pkg.my_mod:MyLoss``) or by entry point (group ``agentrl.policy_losses``).

Built in (formulas, sources and what composes with what in docs/learner.md): ``vanilla`` (dual-clip
PPO, the default), ``gspo``, ``sapo``, ``gpg``, ``clip_cov``, ``kl_cov``, ``gmpo``, ``cispo``. The
learner's shared part (ratio, behaviour weight, aggregation, KL and entropy terms, metrics) is
:func:`agentrl.learner.losses.policy_loss`.
"""

from agentrl.estimators.params import param
from agentrl.policy_losses.base import (AGG_MODES, KL_TYPES, LOG_RATIO_CLAMP, LossInputs, LossTerms, NoParams,
                                        PolicyLoss, masked_mean, ppo_clip_token_losses, row_mean)
from agentrl.policy_losses.registry import (DEFAULT, PARAMS_SECTION, POLICY_LOSSES, build_policy_loss,
                                            builtin_policy_losses, check_composition, is_builtin, params_key,
                                            policy_loss_class, policy_loss_values, register_policy_loss,
                                            resolve_agg_mode)

__all__ = ["AGG_MODES", "DEFAULT", "KL_TYPES", "LOG_RATIO_CLAMP", "LossInputs", "LossTerms", "NoParams",
           "PARAMS_SECTION", "POLICY_LOSSES", "PolicyLoss", "build_policy_loss", "builtin_policy_losses",
           "check_composition", "is_builtin", "masked_mean", "param", "params_key", "policy_loss_class",
           "policy_loss_values", "ppo_clip_token_losses", "register_policy_loss", "resolve_agg_mode", "row_mean"]
