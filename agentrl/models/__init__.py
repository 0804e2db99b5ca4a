"""Policy models: tiny Qwen2-architecture models built here, real checkpoints loaded by name.

The names below are imported on first use (PEP 562): ``agentrl.models.shapes`` (the known
architectures' sizes, no torch) is then importable without loading transformers, which the
placement plan (``agentrl plan``) relies on to start fast."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "build_tiny_model": "architectures", "count_parameters": "architectures", "qwen25_config": "architectures",
    "is_model_dir": "loading", "load_model": "loading", "load_tokenizer": "loading",
    "prepare_initial_model": "loading", "resolve_dtype": "loading", "stored_dtype": "loading",
    "CHAT_TEMPLATE": "tokenizer", "stop_token_ids": "tokenizer", "train_tokenizer": "tokenizer",
    "empty_cache": "decode_cache", "preallocated_cache": "decode_cache",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
