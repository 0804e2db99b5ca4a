"""The generation tests' model: the rollout tests' tiny model directory and its tokenizer."""

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
