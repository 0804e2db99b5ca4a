"""Two learner ranks through Ray give the same numbers as one rank in-process; shutting a group
down closes its process group."""

import math

import pytest
import torch
import torch.distributed as dist

ray = pytest.importorskip("ray")

from agentrl.learner.group import LearnerGroup
from agentrl.weights import PackedPath, unpack_weights
from tiny_setup import learner_config, step_batch, write_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def group(model_dir, ranks, stage):
    # 7 rows, micro 3: rank 1 gets 3 rows (one micro-batch) while rank 0 runs two, so rank 1 pads
    # with an empty one; the update's mini-batch of 7 splits 4/3 over the ranks
    cfg = learner_config(num_ranks=ranks, zero_stage=stage, mini_batch_size=7, micro_batch_size=3, ppo_epochs=2)
    return LearnerGroup(cfg, model_dir)


@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_through_ray_equal_one_rank(stage, model_dir, ray_cluster):
    batch = step_batch(7, seed=11)
    single = group(model_dir, 1, stage)
    pair = group(model_dir, 2, stage)
    try:
        assert single.local is not None and len(pair.actors) == 2
        assert ray.get([actor.denormals_flushed.remote() for actor in pair.actors]) == [True, True]
        one, two = single.compute_logprobs(batch, hidden_layer=-1), pair.compute_logprobs(batch, hidden_layer=-1)
        for name in ("old_logprobs", "ref_logprobs", "hidden"):
            assert torch.allclose(getattr(one, name), getattr(two, name), atol=1e-6), name
        for _ in range(2):
            m1, m2 = single.update(one), pair.update(two)
            assert m1["optimizer_steps"] == m2["optimizer_steps"] == 2
            for key in ("loss", "pg_loss", "kl_ref", "entropy", "pg_clipfrac", "grad_norm"):
                assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
        w1, w2 = single.state_dict_for_rollout(), pair.state_dict_for_rollout()
        assert w1.keys() == w2.keys()
        for name in w1:
            assert torch.allclose(w1[name], w2[name], atol=1e-5), name
        packed = unpack_weights(pair.weights_call(PackedPath.Sender, "pack")[0])   # rank 0's buckets, through Ray
        assert all(torch.equal(packed[name], w2[name]) for name in w2)
    finally:
        pair.shutdown()


def test_shutdown_closes_the_process_group_and_a_later_learner_starts_a_new_one(model_dir):
    batch = step_batch(6, seed=5)
    first = group(model_dir, 1, 2)
    assert dist.is_initialized()
    first.shutdown()
    # the group is gone (NCCL frees its communicators; torch no longer warns at exit)
    assert first.local is None and not dist.is_initialized()
    second = group(model_dir, 1, 2)
    try:
        filled = second.compute_logprobs(batch)
        assert torch.isfinite(filled.old_logprobs).all()
        assert math.isfinite(second.update(filled)["loss"])
    finally:
        second.shutdown()
    assert not dist.is_initialized()
