"""Shared fixtures: a tiny random-init model directory (hidden 64, 2 layers) and its tokenizer."""

from __future__ import annotations

import pytest

from agentrl.models import build_tiny_model, load_tokenizer, train_tokenizer
from agentrl.warmstart.demonstrations import corpus_texts
from rollout_helpers import TINY


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Byte-level BPE trained on TextCraft and WebShop expert text, and a random tiny model."""
    texts = []
    for env in ("textcraft", "webshop"):
        texts += corpus_texts(env, {}, "train", 30, history_length=2, think=True, style="compact")
    tokenizer = train_tokenizer(texts, vocab_size=600)
    model = build_tiny_model(TINY, tokenizer, seed=0)
    out = tmp_path_factory.mktemp("models") / "tiny"
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def alfworld_games_dir(tmp_path_factory) -> str:
    """Two ALFWorld games of ``valid_seen`` in the official layout (a few seconds), so rollout tests
    do not wait for the first-use set of 216 games. Use as ``data_dir`` or ``ALFWORLD_DATA``."""
    from agentrl.envs.alfworld.generate import generate_dataset

    out = str(tmp_path_factory.mktemp("alfworld-games"))
    generate_dataset(out, {"valid_seen": 2}, seed=0, workers=2)
    return out
