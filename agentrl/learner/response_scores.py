"""Log-probs and entropy of the response tokens from the model's final hidden states, a bounded number
of tokens at a time (``learner.logprob_chunk_tokens``).

The full path asks the model for the logits of every position from the shortest prompt's last token
on, ``[rows x positions x vocabulary]``, and takes their float32 log-softmax: at Qwen2.5's 151,936-token
vocabulary, 8 rows of ~1,500 kept positions are ~7 GB in float32, and backward doubles it. Here the
model's output head runs on nothing but the final hidden states of the positions that predict a
response token, ``C`` of them at a time: each chunk's float32 logits ``[C x V]`` live only while that
chunk's log-probs and entropy are taken. With gradients each chunk runs under activation checkpointing
(:func:`torch.utils.checkpoint.checkpoint`), so backward recomputes one chunk's logits at a time instead
of keeping them all from the forward pass: no ``[positions x V]`` float32 tensor larger than ``C x V``
exists at once, forward or backward. The result equals the full path's (same operations on the same
hidden states; tests/learner/test_response_scores.py).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint

from agentrl.learner.sequences import PackedSequences
from agentrl.models.hidden_states import hidden_state_module


class FinalHiddenCapture:
    """Context manager: keep the final hidden states (after the last norm, what the output head reads)
    ``[rows, tokens, hidden]`` of the forward pass inside it, with their autograd history."""

    def __init__(self, model: torch.nn.Module, num_layers: int):
        self.module = hidden_state_module(model, num_layers, num_layers)
        self.states: Optional[torch.Tensor] = None
        self._handle = None

    def _hook(self, module, inputs, output) -> None:
        self.states = output[0] if isinstance(output, (tuple, list)) else output

    def __enter__(self) -> "FinalHiddenCapture":
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The module that turns final hidden states into logits (``lm_head``; peft models unwrapped)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model.get_output_embeddings()


def response_token_index(packed: PackedSequences) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the hidden state that predicts each response token sits in the flattened input
    ``[rows * width]`` (one index per trained response token, row-major), and the ``[n, R]`` mask of
    those tokens. Response token ``j`` of row ``i`` is predicted at its row's position ``P_i - 1 + j``;
    a padding-free row starts where the previous one ends."""
    device = packed.input_ids.device
    j = torch.arange(packed.response_width, device=device).unsqueeze(0)
    valid = j < packed.response_lengths.unsqueeze(1)
    if packed.padding_free:
        lengths = packed.prompt_lengths + packed.response_lengths
        starts = torch.cumsum(lengths, 0) - lengths
    else:
        starts = torch.arange(len(packed.prompt_lengths), device=device) * packed.input_ids.shape[1]
    position = starts.unsqueeze(1) + packed.prompt_lengths.unsqueeze(1) - 1 + j
    return position[valid], valid


def _chunk_scores(head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                  entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy (empty without ``entropy``) of ``tokens`` [C] from hidden states [C, H]:
    the chunk's float32 logits live only inside this call."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logsumexp = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(1, tokens.unsqueeze(1)).squeeze(1) - logsumexp
    if not entropy:
        return logprobs, logprobs.new_zeros(0)
    with nullcontext() if entropy_grad else torch.no_grad():
        return logprobs, logsumexp - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def chunked_scores(head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                   chunk_tokens: int, entropy: bool = False, entropy_grad: bool = False
                   ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs [N] of ``tokens`` [N] (and their entropy with ``entropy``) from hidden states [N, H],
    ``chunk_tokens`` tokens at a time (0: all at once). With gradients enabled each chunk is
    checkpointed: its logits are recomputed in backward, one chunk at a time."""
    size = chunk_tokens if chunk_tokens > 0 else max(len(tokens), 1)
    grad = torch.is_grad_enabled() and hidden.requires_grad
    logprobs, entropies = [], []
    for start in range(0, len(tokens), size):
        h, t = hidden[start:start + size], tokens[start:start + size]
        if grad:
            lp, ent = checkpoint(_chunk_scores, head, h, t, temperature, entropy, entropy_grad, use_reentrant=False)
        else:
            lp, ent = _chunk_scores(head, h, t, temperature, entropy, False)
        logprobs.append(lp)
        entropies.append(ent)
    if not logprobs:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if entropy else None)
    return torch.cat(logprobs), (torch.cat(entropies) if entropy else None)


def scatter_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-token values [N] back into their rows [n, R] (0 where ``valid`` is False), differentiably."""
    return torch.zeros(valid.shape, dtype=values.dtype, device=values.device).masked_scatter(valid, values)


__all__ = ["FinalHiddenCapture", "chunked_scores", "output_head", "response_token_index", "scatter_rows"]
