"""Micro-batches cut by a token budget (learner.max_tokens_per_micro_batch): rows packed by length under the
budget, ranks given about as many tokens each, and the same gradient as micro-batches of a fixed row count."""

import pytest
import torch

from agentrl.learner.engine import Learner
from agentrl.learner.sequences import rank_micro_batches, sequence_lengths, token_balanced_parts, token_budget_split
from tiny_setup import learner_config, step_batch, write_tiny_model

LENGTHS = torch.tensor([9, 3, 7, 1, 8, 2, 6, 4, 5, 12, 10, 11, 30])


def test_rows_are_packed_by_length_under_the_budget():
    rows = torch.arange(len(LENGTHS))
    padded = token_budget_split(rows, LENGTHS, 20)
    assert sorted(torch.cat(padded).tolist()) == rows.tolist()
    order = LENGTHS[torch.cat(padded)].tolist()
    assert order == sorted(order)
    for micro in padded[:-1]:
        assert len(micro) * int(LENGTHS[micro].max()) <= 20
    assert padded[-1].tolist() == [12]                      # a row over the budget goes alone
    assert [len(m) for m in padded] == [4, 2, 2, 2, 1, 1, 1]   # short rows many to a micro-batch, long ones few
    free = token_budget_split(rows, LENGTHS, 20, padding_free=True)
    assert all(int(LENGTHS[m].sum()) <= 20 for m in free[:-1])
    assert [len(m) for m in free] == [5, 2, 2, 1, 1, 1, 1]      # no padding: the first one takes a row more


def test_ranks_get_about_as_many_tokens_and_as_many_micro_batches():
    minibatch = torch.randperm(len(LENGTHS), generator=torch.Generator().manual_seed(0))
    parts = token_balanced_parts(minibatch, LENGTHS, 2)
    assert [int(LENGTHS[p].sum()) for p in parts] == [54, 54]
    assert [int(LENGTHS[p].sum()) for p in torch.tensor_split(minibatch, 2)] == [71, 37]   # split by rows
    plans = [rank_micro_batches(minibatch, r, 2, 4, LENGTHS, max_tokens=24) for r in range(2)]
    assert len(plans[0]) == len(plans[1])
    assert sorted(torch.cat([torch.cat(p) for p in plans]).tolist()) == sorted(minibatch.tolist())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_the_gradient_is_the_fixed_size_splits(model_dir):
    """Every micro-batch's loss is divided by the whole mini-batch's denominator: however the rows are
    cut, the summed gradient, the loss and the weights after the step are the same."""
    batch = step_batch(8, seed=21)
    budget = 40
    lengths = sequence_lengths(batch)
    fixed_plan = rank_micro_batches(torch.arange(8), 0, 1, 2, lengths)
    budget_plan = rank_micro_batches(torch.arange(8), 0, 1, 2, lengths, max_tokens=budget)
    assert [len(m) for m in budget_plan] != [len(m) for m in fixed_plan]      # cut differently
    results = []
    for settings in ({}, {"max_tokens_per_micro_batch": budget}):
        learner = Learner(learner_config(mini_batch_size=8, **settings), model_dir)
        scored = learner.compute_logprobs(batch)
        metrics = learner.update(scored)
        results.append((scored, metrics, learner.state_dict_for_rollout()))
    (s1, m1, w1), (s2, m2, w2) = results
    trained = batch.response_mask > 0
    assert torch.allclose(s1.old_logprobs[trained], s2.old_logprobs[trained], atol=1e-5)
    for key in ("loss", "pg_loss", "entropy", "kl_ref", "grad_norm"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-5, abs=1e-6), key
    assert all(torch.allclose(w1[k], w2[k], atol=1e-6) for k in w1)
