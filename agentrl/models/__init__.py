"""Policy models: tiny Qwen2-architecture models built here, real checkpoints loaded by name."""

from agentrl.models.architectures import build_tiny_model, count_parameters, qwen25_config
from agentrl.models.loading import (is_model_dir, load_model, load_tokenizer, prepare_initial_model, resolve_dtype,
                                    stored_dtype)
from agentrl.models.tokenizer import CHAT_TEMPLATE, stop_token_ids, train_tokenizer

__all__ = ["CHAT_TEMPLATE", "build_tiny_model", "count_parameters", "is_model_dir", "load_model", "load_tokenizer",
           "prepare_initial_model", "qwen25_config", "resolve_dtype", "stop_token_ids", "stored_dtype",
           "train_tokenizer"]
