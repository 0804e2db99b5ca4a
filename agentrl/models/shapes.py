"""Model shapes without torch: the Qwen2.5 architectures agentrl knows and their parameter counts.

``QWEN25_ARCHITECTURES`` holds the published ``config.json`` numbers of the Qwen2.5 instruct
checkpoints (``model.random_init`` builds them from here, :mod:`agentrl.models.architectures`).
:class:`ModelShape` counts a Qwen2-style decoder's parameters from those numbers (what the placement
plan's memory estimates start from, :mod:`agentrl.placement.memory`); :func:`shape_of_config` reads
one from a ``config.json`` dictionary (a local model directory or the Hugging Face cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# Published architecture hyper-parameters of the Qwen2.5 instruct checkpoints (config.json).
QWEN25_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True),
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                     tie_word_embeddings=False),
}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Qwen2-style decoder (Llama-like, with biases on the q/k/v projections)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool

    @property
    def kv_size(self) -> int:
        """Width of the k and v projections: key/value heads x head size."""
        return self.num_kv_heads * (self.hidden_size // self.num_heads)

    def layer_parameters(self) -> int:
        h, i, kv = self.hidden_size, self.intermediate_size, self.kv_size
        attention = (h * h + h) + 2 * (h * kv + kv) + h * h     # q, k, v (with biases), o
        return attention + 3 * h * i + 2 * h                    # gate, up, down; two RMSNorms

    def parameters(self) -> int:
        """Every parameter, the output head counted once when it shares the embedding."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_layers * self.layer_parameters() + self.hidden_size

    def lora_parameters(self, rank: int) -> int:
        """LoRA adapters of ``rank`` on every linear layer of the decoder (``target_modules="all-linear"``,
        which leaves out the output head): ``rank x (inputs + outputs)`` per projection."""
        h, i, kv = self.hidden_size, self.intermediate_size, self.kv_size
        per_layer = (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + i) + (i + h)
        return rank * per_layer * self.num_layers


def shape_of_config(name: str, config: Mapping[str, Any]) -> ModelShape:
    """The shape a Hugging Face ``config.json`` (as a dictionary) describes."""
    heads = int(config["num_attention_heads"])
    return ModelShape(name=name, hidden_size=int(config["hidden_size"]),
                      intermediate_size=int(config["intermediate_size"]),
                      num_layers=int(config["num_hidden_layers"]), num_heads=heads,
                      num_kv_heads=int(config.get("num_key_value_heads") or heads),
                      vocab_size=int(config["vocab_size"]),
                      tie_word_embeddings=bool(config.get("tie_word_embeddings", False)))


def known_shape(name: str) -> ModelShape | None:
    """The shape of a Qwen2.5 checkpoint named by its hub name, None for another name."""
    config = QWEN25_ARCHITECTURES.get(name)
    return shape_of_config(name, config) if config is not None else None


__all__ = ["ModelShape", "QWEN25_ARCHITECTURES", "known_shape", "shape_of_config"]
