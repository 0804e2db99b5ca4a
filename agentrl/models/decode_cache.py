"""The KV caches of the torch engine's prefill and decode (agentrl.generation.torch_engine).

* :func:`empty_cache`: transformers' ``DynamicCache``, which a forward pass fills (the prefill);
* :func:`preallocated_cache`: one whose layers keep keys and values in buffers with room for the
  whole response (:class:`PreallocatedLayer`), so each decoded token is written in place instead of
  concatenating the cache every step.

The engine reaches these through :mod:`agentrl.models`' names imported on first use, so reading the
back ends' declarations (the config, ``agentrl plan``) does not load transformers.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's KV cache in a buffer with spare positions: ``update`` writes in place.

    ``keys``/``values`` are views of the filled part (what attention reads). A buffer that runs
    out of room grows by doubling (not expected: the engine sizes it for the whole response)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._k, self._v, self._len = keys, values, int(length)
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self._len + key_states.shape[-2]
        if end > self._k.shape[-2]:
            extra = max(end, 2 * self._k.shape[-2]) - self._k.shape[-2]
            self._k = torch.cat([self._k, self._k.new_zeros(*self._k.shape[:2], extra, self._k.shape[3])], dim=2)
            self._v = torch.cat([self._v, self._v.new_zeros(*self._v.shape[:2], extra, self._v.shape[3])], dim=2)
        self._k[:, :, self._len:end] = key_states
        self._v[:, :, self._len:end] = value_states
        self._len = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._len

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._k = self._k.index_select(0, beam_idx.to(self._k.device))
        self._v = self._v.index_select(0, beam_idx.to(self._v.device))
        self._views()


def empty_cache() -> DynamicCache:
    """A cache the next forward pass fills."""
    return DynamicCache()


def preallocated_cache(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], length: int) -> DynamicCache:
    """A cache over per-layer buffers ``[rows, heads, positions, head_dim]`` whose first ``length``
    positions are filled."""
    cache = DynamicCache()
    cache.layers = [PreallocatedLayer(k, v, length) for k, v in zip(keys, values)]
    return cache


__all__ = ["PreallocatedLayer", "empty_cache", "preallocated_cache"]
