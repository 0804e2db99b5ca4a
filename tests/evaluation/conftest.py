"""Shared pieces of the evaluation tests: tiny settings and a tiny starting policy (hidden 64)."""

from __future__ import annotations

import pytest

from eval_cli import RECIPE, TINY


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> str:
    """A tiny random TextCraft policy as a Hugging Face directory (tokenizer trained on env text)."""
    from agentrl.config import load_config
    from agentrl.models import prepare_initial_model
    from agentrl.warmstart.starting_policy import corpus_builder

    cfg = load_config(RECIPE, TINY)
    out = tmp_path_factory.mktemp("policy") / "init"
    return prepare_initial_model(cfg.model, cfg.tokenizer, out, corpus=corpus_builder(cfg), seed=0)
