"""Fixtures of the reliability tests: one small tokenizer (one torch thread: tests/conftest.py)."""

from __future__ import annotations

import pytest

from agentrl.models import train_tokenizer
from agentrl.warmstart.demonstrations import corpus_texts


@pytest.fixture(scope="session")
def tokenizer():
    """Byte-level BPE (any unicode round-trips) trained on a little TextCraft expert text."""
    texts = corpus_texts("textcraft", {}, "train", 10, history_length=2, think=True, style="compact")
    return train_tokenizer(texts, vocab_size=400)
