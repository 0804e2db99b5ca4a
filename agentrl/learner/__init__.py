"""Policy optimisation: pure loss functions and the DeepSpeed learner around a causal LM."""

from agentrl.learner.losses import (ADDITIVE_METRICS, AGG_MODES, KL_TYPES, LossOutput, LossSettings, aggregate,
                                    entropy_from_logits, importance_log_ratio, inputs_finite, kl_penalty,
                                    loss_denominator, policy_loss, ppo_clip_token_losses, token_logprobs)

__all__ = ["ADDITIVE_METRICS", "AGG_MODES", "KL_TYPES", "LossOutput", "LossSettings", "aggregate",
           "entropy_from_logits", "importance_log_ratio", "inputs_finite", "kl_penalty", "loss_denominator",
           "policy_loss", "ppo_clip_token_losses", "token_logprobs"]
