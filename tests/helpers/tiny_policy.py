"""The gateway tests' tiny policy: a BPE trained on TextCraft text and a random tiny Qwen2 model, saved
together (what make_backend and load_tokenizer read)."""

from __future__ import annotations

from agentrl.config.schema import TinyModelConfig
from agentrl.models import build_tiny_model, train_tokenizer
from agentrl.warmstart.demonstrations import corpus_texts

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                       max_position_embeddings=4096)


def textcraft_tokenizer(vocab_size: int = 800):
    texts = corpus_texts("textcraft", {}, "train", 20, history_length=2, think=True, style="compact")
    return train_tokenizer(texts, vocab_size=vocab_size)


def save_tiny_policy(out, vocab_size: int = 800, seed: int = 0):
    """Tokenizer and random model in ``out``; the tokenizer."""
    tokenizer = textcraft_tokenizer(vocab_size)
    build_tiny_model(TINY, tokenizer, seed=seed).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return tokenizer
