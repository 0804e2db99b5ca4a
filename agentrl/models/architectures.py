"""Model architectures agentrl builds itself: tiny CPU models and the Qwen2.5 shapes.

``build_tiny_model`` makes a Qwen2-architecture causal LM from :class:`TinyModelConfig`. The
Qwen2.5 entries (their table is :mod:`agentrl.models.shapes`) let a GPU smoke run (or a shape test
on CPU) build the real architecture with random weights when the checkpoint is not on the machine
(``model.random_init=true``).
"""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl.models.shapes import QWEN25_ARCHITECTURES  # noqa: F401 - the table lives in the torch-free module

_QWEN25_COMMON = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                      hidden_act="silu", use_sliding_window=False)


def tiny_config(tiny_cfg, tokenizer) -> Qwen2Config:
    """A Qwen2Config for the tiny model, with the tokenizer's vocabulary and special ids."""
    if tiny_cfg.hidden_size % tiny_cfg.num_heads:
        raise ValueError(f"model.tiny.hidden_size ({tiny_cfg.hidden_size}) must be divisible by "
                         f"model.tiny.num_heads ({tiny_cfg.num_heads})")
    if tiny_cfg.num_heads % tiny_cfg.num_kv_heads:
        raise ValueError(f"model.tiny.num_heads ({tiny_cfg.num_heads}) must be divisible by "
                         f"model.tiny.num_kv_heads ({tiny_cfg.num_kv_heads})")
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=tiny_cfg.hidden_size,
        intermediate_size=tiny_cfg.intermediate_size,
        num_hidden_layers=tiny_cfg.num_layers,
        num_attention_heads=tiny_cfg.num_heads,
        num_key_value_heads=tiny_cfg.num_kv_heads,
        max_position_embeddings=tiny_cfg.max_position_embeddings,
        rope_theta=tiny_cfg.rope_theta,
        tie_word_embeddings=tiny_cfg.tie_word_embeddings,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_sliding_window=False,
    )


def build_tiny_model(tiny_cfg, tokenizer, seed: int = 0) -> Qwen2ForCausalLM:
    """Randomly initialised tiny Qwen2 model (deterministic for a seed)."""
    config = tiny_config(tiny_cfg, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def qwen25_config(name: str, vocab_size: int | None = None) -> Qwen2Config:
    """The Qwen2.5 architecture named ``name`` (its hub name), optionally with another vocabulary."""
    if name not in QWEN25_ARCHITECTURES:
        raise ValueError(f"no built-in architecture for {name!r}; known: {', '.join(QWEN25_ARCHITECTURES)}")
    params = {**_QWEN25_COMMON, **QWEN25_ARCHITECTURES[name]}
    if vocab_size is not None:
        params["vocab_size"] = vocab_size
    return Qwen2Config(**params)


def count_parameters(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
