"""Sampling from next-token logits: temperature, top-k, top-p, one seeded draw per row.

Greedy (``temperature == 0``), or temperature then top-k then top-p filtering, drawn by inverse CDF
with one uniform number per row from a ``torch.Generator`` seeded from ``SamplingParams.seed``: the
same logits with the same generator give the same tokens. (It draws the same distribution as
``torch.multinomial``, ~15x cheaper on CPU, but not the same stream.) Log-probs come from the same
logits the sampler used: ``log_softmax(logits / T)`` of the sampled token, before top-k/top-p
filtering (verl's convention; see :mod:`agentrl.generation.base`).
"""

from __future__ import annotations

import torch

from agentrl.generation.base import SamplingParams


def filter_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (set to -inf) the logits outside the top-k and the top-p nucleus, row by row."""
    if top_k > 0 and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs          # mass of the tokens ranked above
        drop_sorted = before >= top_p                          # always keeps the most likely token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def draw_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` ``[B, V]`` (non-negative, rows need not sum to 1), by inverse
    CDF: the first token whose cumulative mass exceeds ``u * total`` with ``u ~ U[0, 1)`` drawn from
    ``generator``. A token of zero probability is never drawn."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, generator=generator, device=probs.device, dtype=cdf.dtype)
    # strictly below the total, so some token's cumulative mass exceeds it even after rounding
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def sample_tokens(logits: torch.Tensor, sampling: SamplingParams,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled token ids ``[B]`` and their log-probs ``[B]`` from next-token logits ``[B, V]``."""
    logits = logits.float()
    if sampling.greedy:
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = torch.argmax(logits, dim=-1)
    else:
        scaled = logits / sampling.temperature
        logprobs = torch.log_softmax(scaled, dim=-1)
        filtered = filter_logits(scaled, sampling.top_k, sampling.top_p)
        tokens = draw_from(torch.softmax(filtered, dim=-1), generator)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


__all__ = ["draw_from", "filter_logits", "sample_tokens"]
