"""Config builders for the rollout tests (small, fast settings)."""

from __future__ import annotations

from agentrl.config.schema import EnvConfig, RolloutConfig


def rollout_config(**overrides) -> RolloutConfig:
    base = dict(max_response_tokens=12, prompt_style="compact", max_prompt_tokens=1536, enable_thinking=True,
                invalid_action_penalty=0.1, temperature=1.0)
    return RolloutConfig(**{**base, **overrides})


def env_config(name: str = "textcraft", **overrides) -> EnvConfig:
    base = dict(name=name, max_steps=3, group_size=2, tasks_per_iteration=2, history_length=2)
    return EnvConfig(**{**base, **overrides})
