"""The DeepSpeed learner on a tiny random Qwen2 model (CPU, gloo, one process)."""

import math
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.estimators import build_estimator
from agentrl.learner.engine import Learner, sampled_logprobs, warn_if_zero3_on_one_rank
from agentrl.learner.sequences import minibatch_plan, pack, rank_micro_batches, sequence_lengths
from agentrl.weights import PackedPath, unpack_weights
from tiny_setup import learner_config, step_batch, write_tiny_model

HIDDEN_LAYER = 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def make_learner(model_dir, **learner):
    return Learner(learner_config(**learner), model_dir)


@pytest.fixture(scope="module")
def zero2(model_dir):
    return make_learner(model_dir, zero_stage=2)


@pytest.fixture(scope="module")
def zero3(model_dir):
    with pytest.warns(RuntimeWarning, match="learner.zero_stage=2"):  # one rank: ZeRO-3 partitions nothing
        return make_learner(model_dir, zero_stage=3)


def test_zero3_warning_only_where_it_partitions_nothing():
    with pytest.warns(RuntimeWarning, match="one learner rank"):
        warn_if_zero3_on_one_rank(3, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_zero3_on_one_rank(3, 2)
        warn_if_zero3_on_one_rank(2, 1)


def reference_pass(hf_model, batch, temperature=1.0):
    """Per-row unpadded Hugging Face forward: response log-probs (under softmax(logits / T)) and the
    last-prompt-token state."""
    logprobs = torch.zeros(batch.response_ids.shape)
    hidden = []
    with torch.no_grad():
        for i in range(len(batch)):
            p = int(batch.prompt_lengths[i])
            ids = torch.cat([batch.prompt_ids[i, :p], batch.response_ids[i]]).unsqueeze(0)
            out = hf_model(input_ids=ids, output_hidden_states=True)
            logp = torch.log_softmax(out.logits[0].float() / temperature, dim=-1)
            for j in range(batch.response_ids.shape[1]):
                logprobs[i, j] = logp[p - 1 + j, batch.response_ids[i, j]]
            hidden.append(out.hidden_states[HIDDEN_LAYER][0, p - 1])
    return logprobs, torch.stack(hidden)


def weights(learner):
    return {k: v.clone() for k, v in learner.state_dict_for_rollout().items()}


# --------------------------------------------------------------------------------------- packing
def test_pack_concatenates_real_tokens_right_padded():
    prompt = torch.tensor([[5, 6, 0], [7, 0, 0]])
    response = torch.tensor([[8, 9, 0], [10, 11, 12]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    packed = pack(prompt, torch.tensor([2, 1]), response, mask, pad_id=0)
    assert packed.input_ids.tolist() == [[5, 6, 8, 9], [7, 10, 11, 12]]
    assert packed.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    packed = pack(prompt, torch.tensor([2, 1]), response, torch.tensor([[1.0, 0, 0], [1.0, 0, 0]]), pad_id=3)
    assert packed.input_ids.tolist() == [[5, 6, 8], [7, 10, 3]]
    assert packed.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert packed.keep_from == 0 and packed.logits_to_keep == 3


def test_update_plan_gives_every_rank_the_same_number_of_micro_batches():
    plan = minibatch_plan(7, 5, 2, torch.Generator().manual_seed(0))
    assert [len(m) for m in plan] == [5, 2, 5, 2]
    assert sorted(torch.cat(plan[:2]).tolist()) == list(range(7))
    for minibatch in plan:
        per_rank = [rank_micro_batches(minibatch, r, 2, 2) for r in range(2)]
        assert len(per_rank[0]) == len(per_rank[1])
        assert sorted(torch.cat([torch.cat(p) for p in per_rank]).tolist()) == sorted(minibatch.tolist())
        assert all(len(m) <= 2 for p in per_rank for m in p)


def test_micro_batches_group_rows_of_similar_length_on_each_rank():
    batch = step_batch(12, seed=4)
    lengths = sequence_lengths(batch)
    trained_to = [max(j + 1 for j, m in enumerate(row) if m > 0) for row in batch.response_mask.tolist()]
    assert lengths.tolist() == [int(p) + r for p, r in zip(batch.prompt_lengths, trained_to)]
    lengths = torch.tensor([9, 3, 7, 1, 8, 2, 6, 4, 5, 12, 10, 11])
    minibatch = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    for world in (1, 2):
        for rank in range(world):
            plain = rank_micro_batches(minibatch, rank, world, 2)
            grouped = rank_micro_batches(minibatch, rank, world, 2, lengths)
            assert len(grouped) == len(plain)                                   # same passes per rank
            assert sorted(torch.cat(grouped).tolist()) == sorted(torch.cat(plain).tolist())  # same rows
            order = lengths[torch.cat(grouped)].tolist()
            assert order == sorted(order)
    width = [int(lengths[m].max()) for m in rank_micro_batches(minibatch, 0, 1, 3, lengths)]
    assert width == [3, 6, 9, 12]           # random order pads most micro-batches to ~the longest


# ------------------------------------------------------------------------------- log-prob pass
@pytest.mark.parametrize("stage", [2, 3])
def test_compute_logprobs_matches_hugging_face(stage, zero2, zero3, hf_model):
    learner = zero2 if stage == 2 else zero3
    batch = step_batch(5, seed=1)
    filled = learner.compute_logprobs(batch, hidden_layer=HIDDEN_LAYER)
    expected_logprobs, expected_hidden = reference_pass(hf_model, batch)
    trained = batch.response_mask > 0
    assert filled.old_logprobs.shape == batch.response_ids.shape
    assert torch.allclose(filled.old_logprobs[trained], expected_logprobs[trained], atol=1e-5)
    assert torch.allclose(filled.hidden, expected_hidden, atol=1e-5)
    # the reference model starts from the same weights
    assert torch.allclose(filled.ref_logprobs[trained], expected_logprobs[trained], atol=1e-5)


def test_logprobs_and_entropy_follow_the_rollout_temperature(model_dir, hf_model):
    """Rollouts at temperature T report log softmax(logits / T); the learner must score the same
    distribution, for the old, the reference and the updated log-probs alike."""
    cfg = learner_config(zero_stage=2, lr=1e-9)
    cfg.rollout.temperature = 0.5
    learner = Learner(cfg, model_dir)
    batch = step_batch(5, seed=1)
    filled = learner.compute_logprobs(batch)
    trained = batch.response_mask > 0
    at_half, _ = reference_pass(hf_model, batch, temperature=0.5)
    at_one, _ = reference_pass(hf_model, batch)
    assert torch.allclose(filled.old_logprobs[trained], at_half[trained], atol=1e-5)
    assert torch.allclose(filled.ref_logprobs[trained], at_half[trained], atol=1e-5)
    assert not torch.allclose(at_half[trained], at_one[trained], atol=1e-3)
    # the first update starts on-policy: ratio 1 and no KL, which only holds when the update's
    # log-probs use the same temperature as the log-prob pass
    metrics = learner.update(filled)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)


def test_hidden_only_when_asked_and_layer_checked(zero2):
    batch = step_batch(3, seed=2)
    assert zero2.compute_logprobs(batch).hidden is None
    with pytest.raises(ValueError, match="hidden_layer"):
        zero2.compute_logprobs(batch, hidden_layer=-8)


def test_without_recompute_the_sampled_rows_keep_the_rollouts_log_probs(model_dir, zero2, hf_model):
    """learner.recompute_logprobs=false: the actor runs only over the expert-guided rows (their
    tokens were not sampled); the reference pass still covers every row."""
    learner = make_learner(model_dir, recompute_logprobs=False)
    batch = step_batch(6, seed=6)
    is_expert = torch.tensor([False, True, False, False, True, False])
    rollout = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(0)) - 3
    batch = batch.with_columns(is_expert=is_expert, rollout_logprobs=rollout.masked_fill(is_expert.unsqueeze(1), 0.0))
    actor_rows = []
    forward = learner._forward

    def counting_forward(model, packed, *args, **kwargs):
        if model is learner.engine:
            actor_rows.append(len(packed.prompt_lengths))
        return forward(model, packed, *args, **kwargs)

    learner._forward = counting_forward
    try:
        filled = learner.compute_logprobs(batch)
    finally:
        learner._forward = forward
    assert sum(actor_rows) == 2                       # the two expert rows, nothing else
    recomputed = zero2.compute_logprobs(batch)
    trained = batch.response_mask > 0
    assert torch.equal(filled.old_logprobs[~is_expert], batch.rollout_logprobs[~is_expert])
    assert torch.allclose(filled.old_logprobs[is_expert][trained[is_expert]],
                          recomputed.old_logprobs[is_expert][trained[is_expert]], atol=1e-6)
    assert torch.allclose(filled.ref_logprobs[trained], recomputed.ref_logprobs[trained], atol=1e-6)
    # hidden states need the actor's pass over every row; the old log-probs stay the rollout's
    with_hidden = learner.compute_logprobs(batch, hidden_layer=HIDDEN_LAYER)
    assert torch.equal(with_hidden.old_logprobs, filled.old_logprobs)
    assert torch.allclose(with_hidden.hidden, reference_pass(hf_model, batch)[1], atol=1e-5)


def test_the_thread_count_is_asked_before_each_micro_batch(model_dir):
    """trainer.mode one_step_off/async lend the rollout's idle cores to the learner: it asks for its
    thread count before every forward (and forward/backward) of a micro-batch."""
    learner = make_learner(model_dir, micro_batch_size=2, kl_coef=0.0)
    before = torch.get_num_threads()
    plan = iter([1, 2] * 10)
    seen = []

    def threads_now() -> int:
        seen.append(torch.get_num_threads())
        return next(plan)

    learner.threads_now = threads_now
    try:
        batch = learner.compute_logprobs(step_batch(6, seed=7))     # 3 micro-batches
        assert len(seen) == 3 and seen[1:] == [1, 2]                # each call's answer was applied
        learner.update(batch)                                       # 1 mini-batch of 3 micro-batches
        assert len(seen) == 6 and seen[3:] == [1, 2, 1] and torch.get_num_threads() == 2
    finally:
        learner.threads_now = None
        torch.set_num_threads(before)


def test_recompute_off_refuses_a_rollout_is_cap():
    from agentrl.config.loading import load_config
    from agentrl.errors import UsageError

    assert not load_config(None, ["learner.recompute_logprobs=false"]).learner.recompute_logprobs
    with pytest.raises(UsageError, match="learner.rollout_is_cap=0, or learner.recompute_logprobs=true"):
        load_config(None, ["learner.recompute_logprobs=false", "learner.rollout_is_cap=2"])


# ----------------------------------------------------------------------------------------- update
def test_zero2_and_zero3_give_the_same_first_update(zero2, zero3):
    batch = step_batch(6, seed=4)
    m2 = zero2.update(zero2.compute_logprobs(batch))
    m3 = zero3.update(zero3.compute_logprobs(batch))
    assert m2["loss"] == pytest.approx(m3["loss"], rel=1e-5, abs=1e-6)
    assert m2["grad_norm"] == pytest.approx(m3["grad_norm"], rel=1e-4)
    assert zero2.state_dict_for_rollout().keys() == zero3.state_dict_for_rollout().keys()


def test_update_changes_weights_and_lowers_the_loss_on_a_fixed_batch(zero2):
    batch = zero2.compute_logprobs(step_batch(6, seed=5))
    before = weights(zero2)
    losses = [zero2.update(batch)["pg_loss"] for _ in range(4)]
    after = weights(zero2)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert losses[-1] < losses[0]
    metrics = zero2.update(batch)
    for key in ("loss", "pg_loss", "kl_ref", "entropy", "pg_clipfrac", "approx_kl", "grad_norm", "tokens_per_s"):
        assert math.isfinite(metrics[key]), key
    assert metrics["optimizer_steps"] == 1 and metrics["skipped_steps"] == 0


def test_rollout_is_cap_weights_sampled_tokens_and_leaves_expert_rows_at_one(model_dir):
    learner = make_learner(model_dir, rollout_is_cap=2.0)
    batch = learner.compute_logprobs(step_batch(6, seed=9))
    is_expert = torch.arange(6) == 0          # an expert's row: its rollout log-probs are 0
    rollout = (batch.old_logprobs - math.log(3.0)).masked_fill(torch.arange(6).unsqueeze(1) == 0, 0.0)
    batch = batch.with_columns(is_expert=is_expert, rollout_logprobs=rollout)
    assert torch.equal(sampled_logprobs(batch)[0], batch.old_logprobs[0])
    metrics = learner.update(batch)
    # pi_old / pi_rollout = 3 on every sampled token (capped at 2), 1 on the expert's
    trained = batch.response_mask > 0
    expert_share = float(trained[0].sum() / trained.sum())
    assert metrics["rollout_is_capped"] == pytest.approx(1 - expert_share, abs=1e-6)
    assert metrics["rollout_is_weight"] == pytest.approx(2 * (1 - expert_share) + expert_share, abs=1e-6)
    assert math.isfinite(metrics["loss"]) and metrics["optimizer_steps"] == 1


def test_non_finite_advantages_skip_the_optimizer_step(zero2):
    batch = zero2.compute_logprobs(step_batch(6, seed=6))
    advantages = batch.advantages.clone()
    advantages[2] = float("nan")
    before = weights(zero2)
    metrics = zero2.update(batch.with_columns(advantages=advantages))
    assert metrics["skipped_steps"] == 1 and metrics["optimizer_steps"] == 0
    after = weights(zero2)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_estimators_loss_options_reach_the_loss(zero2):
    assert zero2.loss_settings(build_estimator("gagpo").loss_options()).action_level_ratio
    assert not zero2.loss_settings(build_estimator("gagpo", action_level_ratio=False).loss_options()).action_level_ratio
    assert not zero2.loss_settings(build_estimator("grpo").loss_options()).action_level_ratio
    assert not zero2.loss_settings().action_level_ratio


# -------------------------------------------------------------------------- checkpoints / export
def test_checkpoint_round_trip_gives_identical_next_losses(zero2, tmp_path):
    batch = zero2.compute_logprobs(step_batch(6, seed=7))
    zero2.save_checkpoint(str(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt.partial").exists()
    first = [zero2.update(batch)["loss"] for _ in range(2)]
    zero2.load_checkpoint(str(tmp_path / "ckpt"))
    again = [zero2.update(batch)["loss"] for _ in range(2)]
    assert again == pytest.approx(first, rel=1e-6, abs=1e-7)


def test_export_hf_loads_with_auto_model(zero2, tmp_path):
    out = zero2.export_hf(str(tmp_path / "hf"))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    state = zero2.state_dict_for_rollout()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    assert (out / "tokenizer.json").is_file()


def test_state_dict_for_rollout_under_zero3_is_full(zero3, hf_model):
    state = zero3.state_dict_for_rollout()
    for name, tensor in hf_model.state_dict().items():
        assert state[name].shape == tensor.shape, name
    # the packed buckets the trainer syncs hold the same tensors, gathered the same way
    buckets = zero3.weights_call(PackedPath.Sender, "pack", 4096)
    assert len(buckets) > 1
    packed = unpack_weights(buckets)
    assert list(packed) == list(state)
    for name, tensor in state.items():
        assert torch.equal(packed[name], tensor), name


# ------------------------------------------------------------------------------------------- LoRA
def test_lora_trains_the_adapter_and_merges_for_rollout(model_dir, hf_model):
    pytest.importorskip("peft", reason="LoRA needs peft (pip install 'agentrl[lora]')")
    learner = make_learner(model_dir, zero_stage=2, lr=1e-2)
    cfg = learner.cfg
    cfg.model.lora_rank = 4
    lora = Learner(cfg, model_dir)
    batch = lora.compute_logprobs(step_batch(6, seed=8))
    trained = batch.response_mask > 0
    # reference = base model with the adapter disabled = the actor before training
    assert torch.allclose(batch.ref_logprobs[trained], batch.old_logprobs[trained], atol=1e-5)
    base = {k: v.clone() for k, v in hf_model.state_dict().items()}
    for _ in range(2):
        lora.update(batch)
    merged = lora.state_dict_for_rollout()
    assert merged.keys() == base.keys()
    packed = unpack_weights(lora.weights_call(PackedPath.Sender, "pack"))
    assert all(torch.equal(packed[name], merged[name]) for name in merged)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    # the merged weights reproduce the adapted model's log-probs
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    plain.load_state_dict(merged)
    adapted = lora.compute_logprobs(batch).old_logprobs
    again = learner.compute_logprobs(batch).old_logprobs  # a full-weight learner, not trained yet
    assert not torch.allclose(adapted[trained], again[trained], atol=1e-4)
    reference, _ = reference_pass(plain.eval(), batch)
    assert torch.allclose(adapted[trained], reference[trained], atol=1e-5)
