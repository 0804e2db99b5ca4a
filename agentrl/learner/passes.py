"""The learner's forward passes: response log-probs (and the hidden states an estimator asks for)
of the actor and the reference, micro-batch by micro-batch (a mix-in of
:class:`agentrl.learner.engine.Learner`)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from agentrl.data import StepBatch
from agentrl.learner import distributed
from agentrl.learner.sequences import (PackedSequences, by_length, pack, pack_batch, response_positions,
                                       sequence_lengths)
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

    def _forward(self, model, packed: PackedSequences):
        packed = packed.to(self.torch_device)
        return model(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                     position_ids=packed.position_ids, logits_to_keep=packed.logits_to_keep, use_cache=False)

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

    def _set_threads(self) -> None:
        if self.threads_now is not None:
            threads = self.threads_now()
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)

    def _dummy_packed(self) -> PackedSequences:
        one = torch.zeros(1, 1, dtype=torch.int64)
        return pack(one, torch.ones(1, dtype=torch.int64), one, torch.zeros(1, 1), 0)

    def _micro_batches(self, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Row chunks of at most micro_batch_size, rows of similar ``lengths`` together (less
        padding); as many on every rank (empty ones pad)."""
        size = self.cfg.learner.micro_batch_size
        rows = len(lengths)
        local = list(by_length(torch.arange(rows), lengths).split(size)) if rows else []
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
            if self.ref_model is not None and self.ref_offloaded:
                self.ref_model.to(self.torch_device)
            try:
                columns["ref_logprobs"], _ = self._logprob_pass(batch, everything, None, None)
            finally:
                if self.ref_model is not None and self.ref_offloaded:
                    self.ref_model.to("cpu")
        return batch.with_columns(**columns)

    def _logprob_pass(self, batch: StepBatch, rows: torch.Tensor, model, layer: Optional[int]
                      ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Response log-probs [len(batch), R] of ``model`` (None = the reference) on ``rows`` (0 on the
        others) and, with a ``layer``, hidden states [len(batch), H] at the last prompt tokens."""
        logprobs = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
        hidden = torch.zeros(len(batch), self.hf_config.hidden_size) if layer is not None else None
        forward = self._reference_forward if model is None else (lambda packed: self._forward(model, packed).logits)
        for chunk in self._micro_batches(sequence_lengths(batch)[rows]):
            self._set_threads()
            if len(chunk) == 0:         # another rank has more micro-batches: a collective per forward
                forward(self._dummy_packed())
                continue
            chunk = rows[chunk]
            micro = batch.select(chunk)
            packed = pack_batch(micro)
            if layer is not None:       # a hook keeps [rows, hidden] at the last prompt tokens, not every layer
                with LastPromptCapture(self.engine.module, layer, self.num_layers,
                                       packed.prompt_lengths - 1) as capture:
                    logits = forward(packed)
                hidden[chunk] = capture.states.float().cpu()
            else:
                logits = forward(packed)
            logprobs[chunk] = self._response_logprobs(self._scaled(logits), packed, micro.response_ids).cpu()
            del logits
        return logprobs, hidden

    def _reference_forward(self, packed: PackedSequences) -> torch.Tensor:
        if self.lora:
            with self.engine.module.disable_adapter():
                return self._forward(self.engine, packed).logits
        return self._forward(self.ref_model, packed).logits

