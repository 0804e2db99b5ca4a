"""Shared fixtures: a tiny random-init model directory (hidden 64, 2 layers) and its tokenizer."""

from __future__ import annotations

import pytest

from agentrl.models import load_tokenizer
from rollout_helpers import write_rollout_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Byte-level BPE trained on TextCraft and WebShop expert text, and a random tiny model."""
    return write_rollout_model(tmp_path_factory.mktemp("models") / "tiny")


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
