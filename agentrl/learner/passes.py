"""The learner's forward passes: response log-probs (and the hidden states an estimator asks for)
of the actor and the reference, micro-batch by micro-batch (a mix-in of
:class:`agentrl.learner.engine.Learner`)."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator, Optional

import torch

from agentrl.data import StepBatch
from agentrl.learner import distributed
from agentrl.learner.losses import entropy_from_logits
from agentrl.learner.response_scores import (FinalHiddenCapture, chunked_scores, output_head, response_token_index,
                                             scatter_rows)
from agentrl.learner.sequences import (PackedSequences, by_length, gather_response, pack, pack_batch,
                                       response_positions, sequence_lengths, token_budget_split)
from agentrl.models.hidden_states import LastPromptCapture, check_hidden_index


def sampled_logprobs(batch: StepBatch) -> torch.Tensor:
    """The rollout backend's log-probs of the response tokens, with the expert's (guided) rows given
    their ``old_logprobs``: nothing sampled those, so their importance weight is 1."""
    guided = batch.is_expert.unsqueeze(1)
    return torch.where(guided, batch.old_logprobs.float(), batch.rollout_logprobs.float())



class LearnerPasses:
    """Forward passes of a :class:`~agentrl.learner.engine.Learner` (its ``engine``, ``ref_model``,
    ``cfg``, ``logit_temperature`` and ``threads_now``)."""

    threads_now: Optional[Callable[[], int]]

    def _forward(self, model, packed: PackedSequences, full_logits: bool = True):
        """The model's output on ``packed``: with ``full_logits`` the logits of every position from the
        shortest prompt's last token on; otherwise none (an empty list of positions to keep: the caller
        reads the final hidden states, :meth:`_scores`)."""
        packed = packed.to(self.torch_device)
        keep = packed.logits_to_keep if full_logits else torch.zeros(0, dtype=torch.int64, device=self.torch_device)
        return model(input_ids=packed.input_ids, attention_mask=None if packed.padding_free else packed.attention_mask,
                     position_ids=packed.position_ids, logits_to_keep=keep, use_cache=False)

    def _scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """Float32 logits divided by the rollout's sampling temperature (``rollout.temperature``)."""
        logits = logits.float()
        return logits if self.logit_temperature == 1.0 else logits / self.logit_temperature

    def _response_logprobs(self, logits: torch.Tensor, packed: PackedSequences, response_ids: torch.Tensor
                           ) -> torch.Tensor:
        """Log-probs [n, R] of the response tokens from kept logits [n, K, V] already divided by the
        sampling temperature (:meth:`_scaled`); 0 past each response."""
        packed = packed.to(logits.device)
        pos, valid = response_positions(packed)
        logsumexp = torch.logsumexp(logits, dim=-1).gather(1, pos)
        rows = torch.arange(logits.shape[0], device=logits.device).unsqueeze(1)
        token_logits = logits[rows, pos, response_ids.to(logits.device)]
        return torch.where(valid, token_logits - logsumexp, torch.zeros_like(logsumexp))

    def _pack(self, batch: StepBatch, padding_free: bool = True) -> PackedSequences:
        """``batch``'s rows as model input: padding-free when ``learner.padding_free`` is on and works here."""
        return pack_batch(batch, padding_free and self.padding_free)

    def _scores(self, model, packed: PackedSequences, response_ids: torch.Tensor, entropy: bool = False,
                entropy_grad: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Log-probs [n, R] of the response tokens under ``model`` (the engine, or the reference model in
        :meth:`_reference`) and with ``entropy`` their entropies; 0 past each response.

        ``learner.logprob_chunk_tokens`` = 0 on padded rows: from the kept logits ``[n, K, V]`` at once.
        Otherwise from the final hidden states of the response positions, that many tokens at a time
        (:mod:`agentrl.learner.response_scores`); padding-free rows always take this path."""
        chunk = self.cfg.learner.logprob_chunk_tokens
        if chunk == 0 and not packed.padding_free:
            logits = self._scaled(self._forward(model, packed).logits)
            logprobs = self._response_logprobs(logits, packed, response_ids)
            if not entropy:
                return logprobs, None
            with nullcontext() if entropy_grad else torch.no_grad():
                return logprobs, gather_response(entropy_from_logits(logits), packed.to(logits.device))
        module = model.module if model is self.engine else model
        with FinalHiddenCapture(module, self.num_layers) as capture:
            self._forward(model, packed, full_logits=False)
        states = capture.states
        index, valid = response_token_index(packed.to(states.device))
        logprobs, entropies = chunked_scores(output_head(module), states.reshape(-1, states.shape[-1])[index],
                                             response_ids.to(states.device)[valid], self.logit_temperature, chunk,
                                             entropy, entropy_grad)
        return scatter_rows(logprobs, valid), (scatter_rows(entropies, valid) if entropy else None)

    def _set_threads(self) -> None:
        if self.threads_now is not None:
            threads = self.threads_now()
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)

    def _dummy_packed(self) -> PackedSequences:
        one = torch.zeros(1, 1, dtype=torch.int64)
        return pack(one, torch.ones(1, dtype=torch.int64), one, torch.zeros(1, 1), 0)

    def _micro_batches(self, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Row chunks of at most micro_batch_size (or, with ``learner.max_tokens_per_micro_batch``, of
        at most that many tokens), rows of similar ``lengths`` together (less padding); as many on every
        rank (empty ones pad)."""
        lc = self.cfg.learner
        rows = len(lengths)
        if lc.max_tokens_per_micro_batch > 0:
            local = token_budget_split(torch.arange(rows), lengths, lc.max_tokens_per_micro_batch, self.padding_free)
        else:
            local = list(by_length(torch.arange(rows), lengths).split(lc.micro_batch_size)) if rows else []
        count = int(distributed.all_reduce_values([len(local)], "max")[0])
        return local + [torch.zeros(0, dtype=torch.int64)] * (count - len(local))

    @torch.no_grad()
    def compute_logprobs(self, batch: StepBatch, hidden_layer: Optional[int] = None) -> StepBatch:
        """Fill ``old_logprobs``, ``ref_logprobs`` (when ``kl_coef > 0``) and, with a
        ``hidden_layer`` (the estimator's ``RowInputs.hidden_layer``), ``hidden``.

        One forward pass of the actor per micro-batch yields both the response log-probs and the
        hidden state at the last prompt token of that layer. With ``learner.recompute_logprobs=false``
        the sampled rows' old log-probs are the rollout backend's and the actor's pass runs only over
        the expert-guided rows (nothing sampled their tokens) unless hidden states are asked for. With
        several ranks each rank is given its own rows (see LearnerGroup); every rank runs as many
        forward passes.
        """
        with_hidden = hidden_layer is not None
        layer = check_hidden_index(int(hidden_layer), self.num_layers) if with_hidden else None
        recompute = self.cfg.learner.recompute_logprobs
        everything = torch.arange(len(batch))
        actor_rows = everything if recompute or with_hidden else torch.nonzero(batch.is_expert).flatten()
        self.engine.eval()
        columns: dict[str, Any] = {}
        old, hidden = self._logprob_pass(batch, actor_rows, self.engine, layer)
        # without recompute only the expert rows' values came from the actor; the rest are the rollout's
        columns["old_logprobs"] = old if recompute else sampled_logprobs(batch.with_columns(old_logprobs=old))
        if with_hidden:
            columns["hidden"] = hidden
        if self.cfg.learner.kl_coef > 0:
            with self._reference() as reference:
                columns["ref_logprobs"], _ = self._logprob_pass(batch, everything, reference, None)
        return batch.with_columns(**columns)

    def _logprob_pass(self, batch: StepBatch, rows: torch.Tensor, model, layer: Optional[int]
                      ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Response log-probs [len(batch), R] of ``model`` (the engine or the reference) on ``rows`` (0 on the
        others) and, with a ``layer``, hidden states [len(batch), H] at the last prompt tokens."""
        logprobs = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
        hidden = torch.zeros(len(batch), self.hf_config.hidden_size) if layer is not None else None
        for chunk in self._micro_batches(sequence_lengths(batch)[rows]):
            self._set_threads()
            if len(chunk) == 0:         # another rank has more micro-batches: a collective per forward
                self._forward(model, self._dummy_packed())
                continue
            chunk = rows[chunk]
            micro = batch.select(chunk)
            if layer is not None:       # a hook keeps [rows, hidden] at the last prompt tokens, not every layer
                packed = self._pack(micro, padding_free=False)
                with LastPromptCapture(self.engine.module, layer, self.num_layers,
                                       packed.prompt_lengths - 1) as capture:
                    scores, _ = self._scores(model, packed, micro.response_ids)
                hidden[chunk] = capture.states.float().cpu()
            else:
                scores, _ = self._scores(model, self._pack(micro), micro.response_ids)
            logprobs[chunk] = scores.cpu()
        return logprobs, hidden

    @contextmanager
    def _reference(self) -> Iterator[Any]:
        """The reference model to run inside it: the engine with its LoRA adapters disabled, or the
        frozen copy (on the device while inside, when ``learner.offload_ref`` keeps it on CPU)."""
        if self.lora:
            with self.engine.module.disable_adapter():
                yield self.engine
            return
        if self.ref_offloaded:
            self.ref_model.to(self.torch_device)
        try:
            yield self.ref_model
        finally:
            if self.ref_offloaded:
                self.ref_model.to("cpu")

