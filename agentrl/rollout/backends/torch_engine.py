"""The built-in torch generation engine: batched sampling with a KV cache (the CPU default).

How one ``generate`` call runs:

1. **Shared prompt beginnings are encoded once, without padding.** The G rollouts of a group
   have the same step-0 prompt, and later prompts of a group still share the task and the
   oldest observation of the history window. Prompts are clustered by common prefix
   (:func:`shared_prefixes`). Each cluster's prefix is prefilled once, alone (no padding, so
   attention runs the causal kernel without a mask), its KV cache is copied out to the members
   (``index_select``), and the members' remainders are prefilled on top of it as one batch (the
   padding sits between prefix and remainder; the mask hides it and position ids skip it). A
   prompt sharing nothing is prefilled alone in one pass. The per-row caches are then
   left-padded to one width and stacked for decoding. (Prefilling one left-padded batch of
   prompts instead was slower on CPU: the padding is computed too, and a masked attention
   falls back to the materialised-matrix kernel.)
2. **Decoding** runs one forward pass per new token for all unfinished rows at once, with the
   cache, the 2-D attention mask (left padding) and explicit position ids.
3. **Finished rows leave the batch**: a row that sampled a stop token (or completed a stop
   string) is removed from the cache, mask and positions before the next forward pass, so long
   and short responses do not cost the same.

Sampling: greedy (``temperature == 0``), or temperature then top-k then top-p filtering, drawn
with a ``torch.Generator`` seeded from ``SamplingParams.seed``: the same prompts with the same
seed give the same tokens. Log-probs come from the same logits the sampler used:
``log_softmax(logits / T)`` of the sampled token, before top-k/top-p filtering (verl's
convention; see :mod:`agentrl.rollout.backends.base`).
"""

from __future__ import annotations

import time
from typing import Mapping, Sequence

import torch
from transformers import DynamicCache

from agentrl.rollout.backends.base import Generation, GenerationBackend, SamplingParams


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


def shared_prefixes(prompts: Sequence[Sequence[int]], min_shared: int) -> tuple[list[list[int]], list[int]]:
    """Cluster prompts that share a leading run of at least ``min_shared`` tokens.

    Returns one prefix per cluster and each prompt's cluster. Prompts are sorted so that shared
    beginnings are neighbours; a cluster's prefix is the longest common prefix of its members,
    cut so that every member keeps at least one token of its own (the last prompt token has to
    go through the model to give the next-token logits). A prompt that shares nothing gets a
    cluster of its own whose prefix is the prompt minus its last token.
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    prefixes: list[list[int]] = []
    source = [0] * len(prompts)
    members: list[list[int]] = []
    for i in order:
        p = prompts[i]
        if prefixes:
            current = prefixes[-1]
            limit = min(len(current), len(p))
            k = 0
            while k < limit and current[k] == p[k]:
                k += 1
            if k >= min_shared:
                prefixes[-1] = current[:k]
                members[-1].append(i)
                continue
        prefixes.append(list(p))
        members.append([i])
    for c, rows in enumerate(members):
        shortest = min(len(prompts[i]) for i in rows)
        prefixes[c] = prefixes[c][:shortest - 1]
        for i in rows:
            source[i] = c
    return prefixes, source


def _left_padded(rows: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.as_tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


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
        probs = torch.softmax(filtered, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


class TorchBackend(GenerationBackend):
    """Batched KV-cache generation with a Hugging Face causal LM, on CPU or one GPU.

    ``tokenizer`` is needed only for stop strings. ``share_prefixes=False`` turns off the shared
    prefill (for measuring what it saves); ``min_shared_tokens`` is the shortest common
    beginning worth sharing.
    """

    name = "torch"

    def __init__(self, model: torch.nn.Module, tokenizer=None, *, share_prefixes: bool = True,
                 min_shared_tokens: int = 16):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.share_prefixes = share_prefixes
        self.min_shared_tokens = int(min_shared_tokens)
        self.device = next(model.parameters()).device
        self._counters = {"calls": 0, "prompts": 0, "prefill_tokens": 0, "prefill_tokens_saved": 0,
                          "generated_tokens": 0, "forward_passes": 0, "seconds": 0.0}

    @classmethod
    def from_pretrained(cls, model_dir: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                        attn_implementation: str = "sdpa", share_prefixes: bool = True) -> "TorchBackend":
        from agentrl.models import load_model, load_tokenizer

        model = load_model(model_dir, dtype=dtype, attn_implementation=attn_implementation).to(device)
        return cls(model, load_tokenizer(model_dir), share_prefixes=share_prefixes)

    # ----- weights -------------------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        own = self.model.state_dict()
        names = {k[len("module."):] if k.startswith("module.") else k: k for k in state_dict}
        unknown = sorted(set(names) - set(own))
        if unknown:
            raise KeyError(f"load_weights: {len(unknown)} names the model does not have, e.g. {unknown[:3]}")
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        missing = sorted(set(own) - set(names) - tied)
        if missing:
            raise KeyError(f"load_weights: {len(missing)} model weights not given, e.g. {missing[:3]}")
        for name, key in names.items():
            value = state_dict[key]
            if tuple(value.shape) != tuple(own[name].shape):
                raise ValueError(f"load_weights: {name} has shape {tuple(value.shape)}, "
                                 f"the model expects {tuple(own[name].shape)}")
            own[name].copy_(value.to(own[name].device, own[name].dtype))

    # ----- generation ----------------------------------------------------------------------------
    def _forward(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        self._counters["forward_passes"] += 1
        return out.logits[:, -1, :]

    def _stop_strings_hit(self, tokens: list[int], stop_strings: Sequence[str], window: int) -> bool:
        text = self.tokenizer.decode(tokens[-window:], skip_special_tokens=False)
        return any(s in text for s in stop_strings)

    def _prefill(self, prompts: list[list[int]]):
        """KV cache, attention mask, next-token logits and next positions of a batch of prompts.

        Cluster by cluster: the shared prefix runs alone without padding (the causal attention
        kernel, no mask), the members' remainders run on top of it as one batch, and then all
        rows' caches are left-padded to one width and stacked in prompt order.
        """
        n = len(prompts)
        if self.share_prefixes and min(len(p) for p in prompts) > 1:
            prefixes, source = shared_prefixes(prompts, self.min_shared_tokens)
        else:
            prefixes, source = [list(p) for p in prompts], list(range(n))
        members: dict[int, list[int]] = {}
        for row, c in enumerate(source):
            members.setdefault(c, []).append(row)
        blocks = []  # (rows, per-layer keys, per-layer values, mask, logits, next positions)
        used = 0
        for c, rows in members.items():
            cache = DynamicCache()
            if len(rows) == 1:
                whole = prompts[rows[0]]  # a prompt of its own: one pass, no padding
                ids = torch.as_tensor([whole], dtype=torch.long, device=self.device)
                logits = self._forward(ids, None, None, cache)
                mask = torch.ones((1, len(whole)), dtype=torch.long, device=self.device)
                next_pos = torch.as_tensor([len(whole)], device=self.device)
                used += len(whole)
            else:
                prefix = prefixes[c]
                if prefix:
                    self._forward(torch.as_tensor([prefix], dtype=torch.long, device=self.device), None, None, cache)
                    cache.reorder_cache(torch.zeros(len(rows), dtype=torch.long, device=self.device))
                suffixes = [prompts[r][len(prefix):] for r in rows]
                ids, suffix_mask = _left_padded(suffixes, self.device)
                mask = torch.cat([suffix_mask.new_ones((len(rows), len(prefix))), suffix_mask], dim=1)
                positions = (len(prefix) + suffix_mask.cumsum(-1) - 1).clamp(min=0)
                logits = self._forward(ids, mask, positions, cache)
                next_pos = positions[:, -1] + 1
                used += len(prefix) + sum(len(x) for x in suffixes)
            blocks.append((rows, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers],
                           mask, logits, next_pos))
        self._counters["prefill_tokens"] += used
        self._counters["prefill_tokens_saved"] += sum(len(p) for p in prompts) - used
        if len(blocks) == 1 and blocks[0][0] == list(range(n)):
            rows, keys, values, mask, logits, next_pos = blocks[0]
            cache = DynamicCache()
            for layer, (k, v) in enumerate(zip(keys, values)):
                cache.update(k, v, layer)
            return cache, mask, logits, next_pos
        width = max(b[3].shape[1] for b in blocks)
        num_layers = len(blocks[0][1])
        k0 = blocks[0][1][0]
        keys = [k0.new_zeros((n, k0.shape[1], width, k0.shape[3])) for _ in range(num_layers)]
        values = [k0.new_zeros((n, k0.shape[1], width, blocks[0][2][0].shape[3])) for _ in range(num_layers)]
        mask = torch.zeros((n, width), dtype=torch.long, device=self.device)
        logits = blocks[0][4].new_empty((n, blocks[0][4].shape[1]))
        next_pos = torch.zeros(n, dtype=torch.long, device=self.device)
        for rows, block_keys, block_values, block_mask, block_logits, block_next in blocks:
            index = torch.as_tensor(rows, dtype=torch.long, device=self.device)
            w = block_mask.shape[1]
            for layer in range(num_layers):
                keys[layer][index, :, width - w:] = block_keys[layer]
                values[layer][index, :, width - w:] = block_values[layer]
            mask[index, width - w:] = block_mask
            logits[index] = block_logits
            next_pos[index] = block_next
        cache = DynamicCache()
        for layer in range(num_layers):
            cache.update(keys[layer], values[layer], layer)
        return cache, mask, logits, next_pos

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        if not prompt_ids:
            return []
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        if sampling.stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: build the backend with one")
        start = time.perf_counter()
        n = len(prompt_ids)
        prompts = [list(map(int, p)) for p in prompt_ids]
        cache, mask, logits, next_pos = self._prefill(prompts)
        # 3. decode, dropping finished rows
        generator = None
        if not sampling.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(int(sampling.seed) & 0x7FFF_FFFF_FFFF_FFFF)
        stop_ids = torch.as_tensor(sorted(set(sampling.stop_token_ids)) or [-1], device=self.device)
        window = max((len(s) for s in sampling.stop_strings), default=0) + 1
        out_tokens: list[list[int]] = [[] for _ in range(n)]
        out_logprobs: list[list[float]] = [[] for _ in range(n)]
        finish = ["length"] * n
        active = list(range(n))
        for t in range(sampling.max_tokens):
            tokens, logprobs = sample_tokens(logits, sampling, generator)
            hit_stop = torch.isin(tokens, stop_ids).tolist()
            token_list, logprob_list = tokens.tolist(), logprobs.tolist()
            keep: list[int] = []
            for j, row in enumerate(active):
                out_tokens[row].append(token_list[j])
                out_logprobs[row].append(logprob_list[j])
                if hit_stop[j] or (sampling.stop_strings and
                                   self._stop_strings_hit(out_tokens[row], sampling.stop_strings, window)):
                    finish[row] = "stop"
                else:
                    keep.append(j)
            self._counters["generated_tokens"] += len(active)
            if not keep or t == sampling.max_tokens - 1:
                break
            if len(keep) != len(active):
                keep_t = torch.as_tensor(keep, dtype=torch.long, device=self.device)
                cache.reorder_cache(keep_t)
                mask, next_pos, tokens = mask[keep_t], next_pos[keep_t], tokens[keep_t]
                active = [active[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            logits = self._forward(tokens[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
        self._counters["calls"] += 1
        self._counters["prompts"] += n
        self._counters["seconds"] += time.perf_counter() - start
        return [Generation(out_tokens[i], out_logprobs[i], finish[i]) for i in range(n)]

    def stats(self) -> dict[str, float]:
        return dict(self._counters)


__all__ = ["TorchBackend", "filter_logits", "sample_tokens"]
