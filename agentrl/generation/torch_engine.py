"""The built-in torch generation engine: batched sampling with a KV cache (the CPU default).

How one ``generate`` call runs:

1. **Prefill without padding masks.** The G rollouts of a group have the same step-0 prompt,
   and later prompts of a group may still share a beginning. Prompts are clustered by common
   prefix (:func:`shared_prefixes`): each cluster's prefix is prefilled once, alone, its KV cache
   is copied to the members, and the members' remainders run on top of it as one batch. Prompts
   that share nothing are prefilled in chunks of about ``prefill_chunk_tokens`` tokens (prompts
   sorted by length, so a chunk holds similar lengths). Batches are **right-padded and run
   without an attention mask**: with causal attention a real token never sees the padding
   after it, so its keys, values and logits are exact, and attention takes the mask-free
   causal kernel. Each row's logits are read at its own last real token. (A left-padded batch
   needs a mask, which sends attention to the slower materialised-matrix kernel; one huge
   batch is also slower on CPU than chunks of ~1k tokens whose activations stay in cache.)
2. **Decode cache.** Every row's real keys/values are copied right-aligned into one buffer per
   layer with room for ``max_tokens`` more positions (:mod:`agentrl.models.decode_cache`), so decoding
   writes each new position in place instead of concatenating the whole cache every token. A
   2-D attention mask hides the left padding (none is passed when all prompts have one length);
   position ids are explicit.
3. **Decoding** runs one forward pass per new token for all unfinished rows at once.
4. **Finished rows leave the batch**: a row that sampled a stop token (or completed a stop
   string) is removed from the cache, mask and positions before the next forward pass, so long
   and short responses do not cost the same.

Sampling: greedy (``temperature == 0``), or temperature then top-k then top-p filtering, drawn
by inverse-CDF with one uniform number per row from a ``torch.Generator`` seeded from
``SamplingParams.seed``: the same prompts with the same seed give the same tokens. (It draws the
same distribution as ``torch.multinomial``, ~15x cheaper on CPU, but not the same stream: the
tokens sampled for a given seed changed when it replaced ``multinomial``.) Log-probs come from the
same logits the sampler used: ``log_softmax(logits / T)`` of the sampled token, before top-k/top-p
filtering (verl's convention; see :mod:`agentrl.generation.base`); the sampler is
:mod:`agentrl.generation.sampling`.

Hidden states (:meth:`TorchBackend.record_hidden`, on when the estimator asks for them through
``RowInputs.hidden_layer``): a forward
hook on the configured layer keeps ``[rows, d]`` at each row's last prompt token during the
prefill's last forward for that row (the one that reads its logits), so ``Generation.hidden``
costs no extra pass; it matches the learner's log-prob pass on the same weights up to float
rounding (tests/generation/test_torch_backend.py).
"""

from __future__ import annotations

import contextlib
import time
from typing import Mapping, Sequence

import torch

from agentrl import models
from agentrl.generation.base import GB, EngineMemory, Generation, GenerationBackend, MemoryInputs, SamplingParams
from agentrl.generation.registry import register_backend
from agentrl.generation.sampling import sample_tokens
from agentrl.models.hidden_states import LastPromptCapture, check_hidden_index

EXTRA_MEMORY = 0.25     # its KV cache and activations on a GPU, as a share of its weights (an assumption)


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


def _right_padded(rows: Sequence[Sequence[int]], device) -> torch.Tensor:
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
    return ids.to(device)


def length_chunks(order: Sequence[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive runs of ``order`` (sorted by length) whose padded size ``count x longest`` stays
    within ``budget`` tokens (a prompt longer than the budget runs alone)."""
    chunks: list[list[int]] = []
    for i in order:
        if chunks and max(lengths[j] for j in chunks[-1] + [i]) * (len(chunks[-1]) + 1) <= budget:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


@register_backend
class TorchBackend(GenerationBackend):
    """Batched KV-cache generation with a Hugging Face causal LM, on CPU or one GPU.

    ``tokenizer`` is needed only for stop strings. ``share_prefixes=False`` turns off the shared
    prefill (for measuring what it saves); ``min_shared_tokens`` is the shortest common
    beginning worth sharing; ``prefill_chunk_tokens`` is the padded size of one prefill batch of
    prompts that share nothing (default 1024 on CPU, where chunks of ~1k tokens ran fastest, and
    32768 on a GPU).
    """

    name = "torch"
    title = "torch"
    loads_weights_between_tokens = True

    def __init__(self, model: torch.nn.Module, tokenizer=None, *, share_prefixes: bool = True,
                 min_shared_tokens: int = 16, prefill_chunk_tokens: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.share_prefixes = share_prefixes
        self.min_shared_tokens = int(min_shared_tokens)
        self.device = next(model.parameters()).device
        if prefill_chunk_tokens is None:
            prefill_chunk_tokens = 1024 if self.device.type == "cpu" else 32768
        self.prefill_chunk_tokens = int(prefill_chunk_tokens)
        self.hidden_index: int | None = None      # record_hidden
        self._counters = {"calls": 0, "prompts": 0, "prefill_tokens": 0, "prefill_tokens_saved": 0,
                          "generated_tokens": 0, "forward_passes": 0, "seconds": 0.0, "weight_switches": 0}

    @classmethod
    def from_pretrained(cls, model_dir: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                        attn_implementation: str = "sdpa", share_prefixes: bool = True) -> "TorchBackend":
        model = models.load_model(model_dir, dtype=dtype, attn_implementation=attn_implementation).to(device)
        return cls(model, models.load_tokenizer(model_dir), share_prefixes=share_prefixes)

    # ----- declarations --------------------------------------------------------------------------
    @classmethod
    def build(cls, model_dir, settings, *, device, dtype, max_model_len, seed) -> "TorchBackend":
        return cls.from_pretrained(model_dir, device=device, dtype=dtype)

    @classmethod
    def auto_preference(cls, device: str) -> int:
        return 1            # everywhere, below a back end that prefers the device

    @classmethod
    def memory(cls, settings, inputs: MemoryInputs) -> EngineMemory:
        """The whole model on its one GPU plus :data:`EXTRA_MEMORY` of it; it never sleeps."""
        weights = inputs.weight_bytes / GB
        budget = weights * (1 + EXTRA_MEMORY)
        return EngineMemory(budget=budget, weights=weights, asleep=budget, backend=cls.name, engine="torch engine",
                            text=f"torch backend: weights {weights:.1f} + KV cache and activations {budget - weights:.1f}")

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

    # ----- hidden states -------------------------------------------------------------------------
    def record_hidden(self, index: int | None) -> bool:
        if index is not None:
            check_hidden_index(int(index), int(self.model.config.num_hidden_layers))
        self.hidden_index = None if index is None else int(index)
        return True

    @torch.inference_mode()
    def prompt_hidden(self, prompt_ids: Sequence[Sequence[int]]) -> torch.Tensor | None:
        if self.hidden_index is None or not prompt_ids:
            return None
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        # the prefill's length-sorted chunks without its decode-cache assembly (nothing is decoded)
        prompts = [list(map(int, p)) for p in prompt_ids]
        lengths = [len(p) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: (lengths[i], i))
        states: torch.Tensor | None = None
        for chunk in length_chunks(order, lengths, self.prefill_chunk_tokens):
            _, hidden = self._forward_right_padded([prompts[i] for i in chunk], models.empty_cache())
            if states is None:
                states = hidden.new_empty((len(prompts), hidden.shape[-1]))
            states[torch.as_tensor(chunk, device=hidden.device)] = hidden
        return states.cpu()

    # ----- generation ----------------------------------------------------------------------------
    def _forward(self, input_ids, attention_mask, position_ids, cache, logits_to_keep=1) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, logits_to_keep=logits_to_keep)
        self._counters["forward_passes"] += 1
        return out.logits[:, -1, :] if isinstance(logits_to_keep, int) else out.logits

    def _forward_right_padded(self, rows: list[list[int]], cache) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prefill right-padded ``rows`` on top of ``cache`` (no mask): logits at each row's last
        token, and the recorded hidden state there (None unless :meth:`record_hidden` is on)."""
        ids = _right_padded(rows, self.device)
        last = [len(r) - 1 for r in rows]
        capture = None
        if self.hidden_index is not None:
            capture = LastPromptCapture(self.model, self.hidden_index, int(self.model.config.num_hidden_layers),
                                        torch.as_tensor(last, device=self.device))
        with capture or contextlib.nullcontext():
            if all(len(r) == ids.shape[1] for r in rows):
                logits = self._forward(ids, None, None, cache)
            else:
                keep = sorted(set(last))
                logits = self._forward(ids, None, None, cache, torch.as_tensor(keep, device=self.device))
                column = torch.as_tensor([keep.index(i) for i in last], device=self.device)
                logits = logits[torch.arange(len(rows), device=self.device), column]
        return logits, (capture.states.float() if capture is not None else None)

    def _stop_strings_hit(self, tokens: list[int], stop_strings: Sequence[str], window: int) -> bool:
        text = self.tokenizer.decode(tokens[-window:], skip_special_tokens=False)
        return any(s in text for s in stop_strings)

    def _prefill(self, prompts: list[list[int]], spare: int):
        """KV cache (room for ``spare`` more positions), attention mask (None without padding),
        next-token logits, next positions and (with :meth:`record_hidden`) the hidden states at
        the last prompt tokens of a batch of prompts.

        Shared-prefix clusters: the prefix alone, then the members' remainders on its cache;
        prompts of their own: in length-sorted chunks. Both right-padded without a mask. The
        rows' real keys/values are then copied right-aligned (left padding) into one buffer.
        """
        n = len(prompts)
        lengths = [len(p) for p in prompts]
        if self.share_prefixes and min(lengths) > 1:
            prefixes, source = shared_prefixes(prompts, self.min_shared_tokens)
        else:
            prefixes, source = [[] for _ in prompts], list(range(n))
        members: dict[int, list[int]] = {}
        for row, c in enumerate(source):
            members.setdefault(c, []).append(row)
        blocks = []  # (rows, per-layer keys, per-layer values, logits, hidden): block row j is prompt rows[j]
        alone = sorted((rows[0] for rows in members.values() if len(rows) == 1), key=lambda i: (lengths[i], i))
        for chunk in length_chunks(alone, lengths, self.prefill_chunk_tokens):
            cache = models.empty_cache()
            logits, hidden = self._forward_right_padded([prompts[i] for i in chunk], cache)
            blocks.append((chunk, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers],
                           logits, hidden))
        used = sum(lengths[i] for i in alone)
        for c, rows in members.items():
            if len(rows) == 1:
                continue
            cache = models.empty_cache()
            prefix = prefixes[c]
            if prefix:
                self._forward(torch.as_tensor([prefix], dtype=torch.long, device=self.device), None, None, cache)
                cache.reorder_cache(torch.zeros(len(rows), dtype=torch.long, device=self.device))
            suffixes = [prompts[r][len(prefix):] for r in rows]
            logits, hidden = self._forward_right_padded(suffixes, cache)
            blocks.append((rows, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers],
                           logits, hidden))
            used += len(prefix) + sum(len(x) for x in suffixes)
        self._counters["prefill_tokens"] += used
        self._counters["prefill_tokens_saved"] += sum(lengths) - used

        width = max(lengths)
        num_layers = len(blocks[0][1])
        k0, v0 = blocks[0][1][0], blocks[0][2][0]
        keys = [k0.new_zeros((n, k0.shape[1], width + spare, k0.shape[3])) for _ in range(num_layers)]
        values = [v0.new_zeros((n, v0.shape[1], width + spare, v0.shape[3])) for _ in range(num_layers)]
        logits = blocks[0][3].new_empty((n, blocks[0][3].shape[-1]))
        hidden = blocks[0][4].new_empty((n, blocks[0][4].shape[-1])) if blocks[0][4] is not None else None
        for rows, block_keys, block_values, block_logits, block_hidden in blocks:
            logits[torch.as_tensor(rows, device=self.device)] = block_logits
            if hidden is not None:
                hidden[torch.as_tensor(rows, device=self.device)] = block_hidden
            by_length: dict[int, list[int]] = {}
            for j, row in enumerate(rows):
                by_length.setdefault(lengths[row], []).append(j)
            for length, js in by_length.items():
                dst = torch.as_tensor([rows[j] for j in js], dtype=torch.long, device=self.device)
                src = torch.as_tensor(js, dtype=torch.long, device=self.device)
                for layer in range(num_layers):
                    keys[layer][dst, :, width - length:width] = block_keys[layer][src, :, :length]
                    values[layer][dst, :, width - length:width] = block_values[layer][src, :, :length]
        cache = models.preallocated_cache(keys, values, width)
        mask = None
        if min(lengths) < width:
            mask = torch.zeros((n, width), dtype=torch.long, device=self.device)
            for row, length in enumerate(lengths):
                mask[row, width - length:] = 1
        next_pos = torch.as_tensor(lengths, dtype=torch.long, device=self.device)
        return cache, mask, logits, next_pos, (hidden.cpu() if hidden is not None else None)

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
        cache, mask, logits, next_pos, hidden = self._prefill(prompts, spare=max(0, sampling.max_tokens - 1))
        # decode, dropping finished rows
        generator = None
        if not sampling.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(int(sampling.seed) & 0x7FFF_FFFF_FFFF_FFFF)
        stop_ids = torch.as_tensor(sorted(set(sampling.stop_token_ids)) or [-1], device=self.device)
        window = max((len(s) for s in sampling.stop_strings), default=0) + 1
        out_tokens: list[list[int]] = [[] for _ in range(n)]
        out_logprobs: list[list[float]] = [[] for _ in range(n)]
        # weights that arrive during the call are loaded between two tokens; each token keeps the
        # version of the weights whose logits it was sampled from
        between = self.weights_between_tokens
        version = between() if between is not None else None
        out_versions: list[list[int]] | None = [[] for _ in range(n)] if between is not None else None
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
                if out_versions is not None:
                    out_versions[row].append(version)
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
                next_pos, tokens = next_pos[keep_t], tokens[keep_t]
                mask = mask[keep_t] if mask is not None else None
                active = [active[j] for j in keep]
            if between is not None and (now := between()) != version:
                # new weights arrived: the prompts and the tokens so far run through them again (a fresh
                # KV cache, as AReaL's interruptible generation does), so every later token is sampled
                # from the new policy alone; the tokens so far keep their version
                version = now
                sequences = [prompts[row] + out_tokens[row] for row in active]
                cache, mask, logits, next_pos, _ = self._prefill(sequences, spare=max(0, sampling.max_tokens - t - 2))
                self._counters["weight_switches"] += 1
                continue
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            logits = self._forward(tokens[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
        self._counters["calls"] += 1
        self._counters["prompts"] += n
        self._counters["seconds"] += time.perf_counter() - start
        return [Generation(out_tokens[i], out_logprobs[i], finish[i], hidden=hidden[i] if hidden is not None else None,
                           versions=out_versions[i] if out_versions is not None else None)
                for i in range(n)]

    def stats(self) -> dict[str, float]:
        return dict(self._counters)


__all__ = ["TorchBackend", "length_chunks", "shared_prefixes"]
