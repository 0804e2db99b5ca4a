"""Which rollout engine a worker runs: agentrl's own loop (:class:`~agentrl.rollout.engine.RolloutEngine`:
prompts built here, one response per env step), or the episodes of an outside agent played through
the OpenAI-compatible gateway (:class:`~agentrl.rollout.agents.engine.AgentEngine`, when
``rollout.agent`` names one). Both take the same arguments and give the same
:class:`~agentrl.rollout.engine.RolloutResult`."""

from __future__ import annotations

from typing import Any

from agentrl.rollout.agents.engine import AgentEngine
from agentrl.rollout.engine import RolloutEngine


def engine_class(rollout_cfg: Any) -> type[RolloutEngine]:
    """:class:`AgentEngine` when ``rollout.agent`` is set, else :class:`RolloutEngine`."""
    return AgentEngine if getattr(rollout_cfg, "agent", None) else RolloutEngine


def build_engine(backend: Any, tokenizer: Any, env_client: Any, rollout_cfg: Any, env_cfg: Any, **kwargs: Any
                 ) -> RolloutEngine:
    """The engine :func:`engine_class` selects, over a generation back end and an env client."""
    if getattr(rollout_cfg, "agent", None):
        kwargs.setdefault("agent", rollout_cfg.agent)
    return engine_class(rollout_cfg)(backend, tokenizer, env_client, rollout_cfg, env_cfg, **kwargs)


__all__ = ["build_engine", "engine_class"]
