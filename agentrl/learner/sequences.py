"""Step records as model inputs: prompt + response in one right-padded sequence, and the
mini-/micro-batch plan of an update.

Row ``i`` becomes ``prompt_ids[i, :P_i] ++ response_ids[i, :L_i]`` where ``P_i`` is the prompt's
length and ``L_i`` is one past the last trained response token (later response tokens cannot
change the log-probs of trained ones: the model is causal). The sequence is right-padded, with
attention mask 1 on real tokens and position ids ``0..P_i+L_i-1``. Response token ``j`` is
predicted by the logits at position ``P_i - 1 + j``; the prompt's last token sits at ``P_i - 1``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from agentrl.data import StepBatch


@dataclasses.dataclass
class PackedSequences:
    input_ids: torch.Tensor        # [n, T] int64
    attention_mask: torch.Tensor   # [n, T] int64
    position_ids: torch.Tensor     # [n, T] int64
    prompt_lengths: torch.Tensor   # [n]
    response_lengths: torch.Tensor  # [n]
    response_width: int            # R, the batch's response column count
    keep_from: int                 # first position whose logits are needed (the shortest prompt's last token)
    padding_free: bool = False     # the rows concatenated into one row [1, sum of lengths] (no padding)

    @property
    def logits_to_keep(self) -> int:
        """How many final positions need logits (passed to Hugging Face ``logits_to_keep``)."""
        return self.input_ids.shape[1] - self.keep_from

    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> "PackedSequences":
        return dataclasses.replace(self, **{f: getattr(self, f).to(device) for f in (
            "input_ids", "attention_mask", "position_ids", "prompt_lengths", "response_lengths")})


def response_lengths(response_mask: torch.Tensor) -> torch.Tensor:
    """One past the last trained token of each row (0 for rows with no trained token)."""
    width = response_mask.shape[1]
    positions = torch.arange(1, width + 1, device=response_mask.device).expand_as(response_mask)
    return torch.where(response_mask > 0, positions, torch.zeros_like(positions)).amax(dim=1) if width else \
        torch.zeros(response_mask.shape[0], dtype=torch.int64)


def pack(prompt_ids: torch.Tensor, prompt_lengths: torch.Tensor, response_ids: torch.Tensor,
         response_mask: torch.Tensor, pad_id: int, padding_free: bool = False) -> PackedSequences:
    """Concatenate each row's real prompt and response tokens into a right-padded batch; with
    ``padding_free`` the rows then follow each other in one row of their summed length, position ids
    restarting at 0 for each (the attention must keep them apart; the learner checks that it does, docs/learner.md)."""
    n = prompt_ids.shape[0]
    p_len = prompt_lengths.to(torch.int64)
    if bool((p_len < 1).any()):
        raise ValueError("every step record needs at least one prompt token")
    r_len = response_lengths(response_mask).to(torch.int64)
    total = p_len + r_len
    width = int(total.max()) if n else 1
    cols = torch.arange(width).unsqueeze(0).expand(n, width)
    # source column inside the prompt or inside the response for every output position
    in_prompt = cols < p_len.unsqueeze(1)
    in_response = (~in_prompt) & (cols < total.unsqueeze(1))
    prompt_part = prompt_ids.gather(1, cols.clamp(max=prompt_ids.shape[1] - 1))
    r_cols = (cols - p_len.unsqueeze(1)).clamp(0, max(response_ids.shape[1] - 1, 0))
    response_part = response_ids.gather(1, r_cols) if response_ids.shape[1] else torch.zeros_like(prompt_part)
    input_ids = torch.where(in_prompt, prompt_part, torch.where(in_response, response_part,
                                                                torch.full_like(prompt_part, pad_id)))
    attention_mask = (in_prompt | in_response).to(torch.int64)
    position_ids = torch.where(attention_mask.bool(), cols, torch.zeros_like(cols)).contiguous()
    keep_from = int(p_len.min()) - 1 if n else 0
    if padding_free and n:
        real = attention_mask.bool()
        input_ids, position_ids = input_ids[real].unsqueeze(0), position_ids[real].unsqueeze(0)
        attention_mask = torch.ones_like(input_ids)
        keep_from = input_ids.shape[1] - 1
    return PackedSequences(input_ids.contiguous(), attention_mask, position_ids, p_len, r_len,
                           int(response_ids.shape[1]), keep_from, padding_free and n > 0)


def pack_batch(batch: StepBatch, padding_free: bool = False) -> PackedSequences:
    return pack(batch.prompt_ids, batch.prompt_lengths, batch.response_ids, batch.response_mask, batch.pad_id,
                padding_free)


def response_positions(packed: PackedSequences) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices into the kept logits ([n, R]) that predict each response token, and a validity mask."""
    j = torch.arange(packed.response_width, device=packed.input_ids.device).unsqueeze(0)
    pos = packed.prompt_lengths.unsqueeze(1) - 1 + j - packed.keep_from
    valid = j < packed.response_lengths.unsqueeze(1)
    last = max(packed.logits_to_keep - 1, 0)
    return pos.clamp(0, last), valid


def gather_response(per_position: torch.Tensor, packed: PackedSequences) -> torch.Tensor:
    """Pick the kept-position values [n, K, ...] that predict each response token -> [n, R, ...]."""
    pos, _ = response_positions(packed)
    index = pos.view(*pos.shape, *([1] * (per_position.dim() - 2))).expand(*pos.shape, *per_position.shape[2:])
    return per_position.gather(1, index)


# ----------------------------------------------------------------------------------- update plan
def minibatch_plan(num_rows: int, mini_batch_size: int, epochs: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Row indices of every mini-batch: ``epochs`` shuffled passes, each cut into mini-batches."""
    plan: list[torch.Tensor] = []
    for _ in range(epochs):
        order = torch.randperm(num_rows, generator=generator)
        plan.extend(order.split(mini_batch_size))
    return plan


def sequence_lengths(batch: StepBatch) -> torch.Tensor:
    """Each row's packed length: its prompt plus its response up to the last trained token."""
    return batch.prompt_lengths.to(torch.int64) + response_lengths(batch.response_mask).to(torch.int64)


def by_length(rows: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """``rows`` ordered by their ``lengths`` (stable), so consecutive chunks pad to similar widths;
    unchanged when ``lengths`` is None."""
    if lengths is None or len(rows) < 2:
        return rows
    return rows[torch.argsort(lengths[rows], stable=True)]


def token_budget_split(rows: torch.Tensor, lengths: torch.Tensor, max_tokens: int, padding_free: bool = False
                       ) -> list[torch.Tensor]:
    """``rows`` ordered by their ``lengths`` (indexed by row) and cut into consecutive micro-batches of at
    most ``max_tokens`` tokens each: padded, rows x the longest row; ``padding_free``, their sum. A row
    longer than the budget is a micro-batch of its own."""
    ordered = by_length(rows, lengths)
    chunks: list[torch.Tensor] = []
    start, longest, total = 0, 0, 0
    for i, length in enumerate(lengths[ordered].tolist()):
        longest, total = max(longest, length), total + length
        cost = total if padding_free else longest * (i - start + 1)
        if cost > max_tokens and i > start:
            chunks.append(ordered[start:i])
            start, longest, total = i, length, length
    if len(ordered):
        chunks.append(ordered[start:])
    return chunks


def token_balanced_parts(minibatch: torch.Tensor, lengths: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """``minibatch`` shared among ``world_size`` ranks with about as many tokens each: longest rows first,
    each to the rank with the fewest tokens so far (ties: the lowest rank)."""
    loads, parts = [0] * world_size, [[] for _ in range(world_size)]
    for row in by_length(minibatch, lengths).flip(0).tolist():
        rank = loads.index(min(loads))
        parts[rank].append(row)
        loads[rank] += int(lengths[row])
    return [torch.tensor(part, dtype=torch.int64) for part in parts]


def rank_micro_batches(minibatch: torch.Tensor, rank: int, world_size: int, micro_batch_size: int,
                       lengths: torch.Tensor | None = None, max_tokens: int = 0, padding_free: bool = False
                       ) -> list[torch.Tensor]:
    """This rank's micro-batches of one mini-batch.

    The mini-batch is split into ``world_size`` contiguous parts and this rank's part into the
    same number of micro-batches on every rank (``ceil(ceil(len / world) / micro)``), so all
    ranks run the same number of forward/backward passes; a part may contain empty micro-batches.
    With ``lengths`` (every row's packed length, :func:`sequence_lengths`) a rank orders its part
    by length before cutting it, so each micro-batch pads to about its own rows' length; the rows
    of each rank, and so the summed gradient, are the same either way.

    With ``max_tokens`` > 0 (``learner.max_tokens_per_micro_batch``, needs ``lengths``) the ranks are
    given about as many tokens each (:func:`token_balanced_parts`) and each rank cuts its part by the
    token budget (:func:`token_budget_split`); every rank plans every rank's part, so all run as many
    micro-batches (the shorter plans end with empty ones) without a collective. The loss of every
    micro-batch is divided by the whole mini-batch's denominator, so the summed gradient does not
    depend on how the rows are cut.
    """
    if max_tokens > 0 and lengths is not None:
        plans = [token_budget_split(part, lengths, max_tokens, padding_free)
                 for part in token_balanced_parts(minibatch, lengths, world_size)]
        count = max(len(plan) for plan in plans)
        return plans[rank] + [torch.zeros(0, dtype=torch.int64)] * (count - len(plans[rank]))
    per_rank = math.ceil(len(minibatch) / world_size)
    count = max(1, math.ceil(per_rank / micro_batch_size))
    part = by_length(torch.tensor_split(minibatch, world_size)[rank], lengths)
    return list(torch.tensor_split(part, count))
