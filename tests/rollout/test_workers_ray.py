"""Rollout workers on a local Ray cluster against env pool actors (TextCraft, WebShop, ALFWorld).

The torch backend here; the same through vLLM workers is in test_vllm_workers.py (run in
.venv-vllm by test_vllm_venv.py)."""

from __future__ import annotations

import pytest
import torch

from agentrl.envs import TaskRef, make_env
from agentrl.models import build_tiny_model
from agentrl.rollout.validation import validate
from agentrl.weights import BroadcastPath, WeightBroadcast, broadcast_layout, pack_weights
from agentrl.rollout.worker_group import RolloutWorkerGroup
from agentrl.rollout.workers import default_torch_threads, split_evenly
from rollout_helpers import TINY, check_batch, check_logprobs_match, env_config, rollout_config

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def _group(model_dir, env_name, env_kwargs=None, **env_overrides):
    env_cfg = env_config(env_name, max_steps=2, group_size=2, tasks_per_iteration=2, **env_overrides)
    cfg = rollout_config(max_response_tokens=6, max_prompt_tokens=1024, prompt_truncation="left")
    return RolloutWorkerGroup(model_dir, cfg, env_cfg, num_workers=2, worker_num_cpus=0.5, env_num_cpus=0.5,
                              env_kwargs=env_kwargs)


@pytest.fixture(scope="class")
def textcraft_group(ray_cluster, tiny_model_dir):
    """Two TextCraft workers over 4 pool instances, for the tests of one class (a group holds 1.5 of
    the cluster's 2 CPUs: it is closed when the class ends); each test loads the weights it checks
    against."""
    with _group(tiny_model_dir, "textcraft") as group:
        yield group


class TestTwoTextcraftWorkers:
    """One group for both tests."""

    def test_textcraft_workers_split_envs_and_load_broadcast_weights(self, textcraft_group, tiny_tokenizer):
        assert split_evenly(5, 2) == [(0, 3), (3, 5)]
        tasks = [TaskRef("depth2", 1), TaskRef("depth2", 2)]
        group = textcraft_group
        assert group.instance_ranges == [(0, 2), (2, 4)]
        # rollout.torch_threads=0 (the default): the machine's cores shared by the 2 workers
        assert ray.get([w.torch_threads.remote() for w in group.workers]) == [default_torch_threads(2)] * 2
        result = group.run(tasks, group_size=2, seed=3)
        check_batch(result, tiny_tokenizer, 2, 2, 2)
        assert result.batch.anchor_obs[0].startswith("Crafting commands:")
        again = group.run(tasks, group_size=2, seed=3)
        assert torch.equal(result.batch.response_ids, again.batch.response_ids)

        other = build_tiny_model(TINY, tiny_tokenizer, seed=7).eval()
        group.load_weights(other.state_dict())
        greedy = group.run(tasks, group_size=2, sampling=group.sampling_params(temperature=0.0))
        check_logprobs_match(other, greedy.batch, (0, len(greedy.batch) - 1))
        # packed buckets (what the trainer sends), several of them, each mapped by both workers
        third = build_tiny_model(TINY, tiny_tokenizer, seed=8).eval()
        buckets = list(pack_weights(third.state_dict().items(), bucket_bytes=64 * 1024))
        assert len(buckets) > 2
        group.load_weights(buckets)
        greedy = group.run(tasks, group_size=2, sampling=group.sampling_params(temperature=0.0))
        check_logprobs_match(third, greedy.batch, (0, len(greedy.batch) - 1))

        val = validate(group, tasks + [TaskRef("depth2", 5)], temperature=0.0)
        assert [e.group_id for e in val.episodes] == [0, 1, 2] and len({e.task for e in val.episodes}) == 3
        assert 0.0 <= val.success_rate <= 1.0 and val.mean_length >= 1

    def test_weights_broadcast_from_rank_zero_to_every_worker(self, textcraft_group, tiny_tokenizer):
        """rollout.weight_sync=broadcast: this process plays the learner's rank 0 of a group of its own
        with the two workers (gloo on CPU; NCCL on GPUs), sends new weights in several buckets, and the
        workers generate with exactly those weights."""
        from agentrl.runtime.rendezvous import reserve_store

        tasks = [TaskRef("depth2", 1), TaskRef("depth2", 2)]
        group = textcraft_group
        port = reserve_store(group.num_workers + 1)
        world = group.num_workers + 1
        joining = group.weights_call_each(BroadcastPath.Receiver, "join",
                                          [("127.0.0.1", port, i + 1, world) for i in range(group.num_workers)])
        sender = WeightBroadcast("127.0.0.1", port, 0, world, "cpu", timeout_s=120)
        group.wait(joining)
        other = build_tiny_model(TINY, tiny_tokenizer, seed=9).eval()
        weights = list(other.state_dict().items())
        layout = broadcast_layout(weights, bucket_bytes=64 * 1024)
        assert len(layout.buckets) > 2
        receiving = group.weights_call(BroadcastPath.Receiver, "receive", layout, version=5)
        sent = sender.send(iter(weights), layout)
        group.wait(receiving)
        assert sent == sum(layout.sizes)
        greedy = group.run(tasks, group_size=2, sampling=group.sampling_params(temperature=0.0))
        check_logprobs_match(other, greedy.batch, (0, len(greedy.batch) - 1))
        assert (greedy.batch.policy_version == 5).all()


@pytest.mark.parametrize("env_name, split", [("webshop", "test"), ("alfworld", "valid_seen")])
def test_other_envs_roll_out_through_ray(ray_cluster, tiny_model_dir, tiny_tokenizer, env_name, split, request):
    # ALFWorld plays two generated games (the alfworld_games_dir fixture, seconds), not the
    # first-use set of 216 games (minutes on 2 cores)
    env_kwargs = {"data_dir": request.getfixturevalue("alfworld_games_dir")} if env_name == "alfworld" else {}
    sizes = make_env(env_name, **env_kwargs).split_sizes()  # a broken or missing env fails here, not skipped
    assert split in sizes and (env_name != "alfworld" or sizes[split] == 2)
    with _group(tiny_model_dir, env_name, env_kwargs) as group:
        result = group.run([TaskRef(split, 0), TaskRef(split, 1)], group_size=2, seed=0)
    check_batch(result, tiny_tokenizer, 2, 2, 2)
    assert all(e.task_type for e in result.episodes)


@pytest.fixture(scope="class")
def guided_group(ray_cluster, tiny_model_dir):
    """Two TextCraft workers with long episodes (15 steps, 40-token responses), BiPACE's hidden
    state (layer 1) recorded, and rollout.torch_threads=3; closed when the class ends."""
    env_cfg = env_config("textcraft", max_steps=15, group_size=2, tasks_per_iteration=2)
    cfg = rollout_config(max_response_tokens=40, max_prompt_tokens=1024, prompt_truncation="left",
                         enable_thinking=False, torch_threads=3)
    with RolloutWorkerGroup(tiny_model_dir, cfg, env_cfg, num_workers=2, worker_num_cpus=0.5,
                            env_num_cpus=0.5, hidden_layer=1) as group:
        yield group


class TestGuidedTextcraftWorkers:
    """One group for both tests."""

    def test_rollout_torch_threads_sets_each_workers_threads(self, guided_group):
        assert ray.get([w.torch_threads.remote() for w in guided_group.workers]) == [3, 3]
        # flushed before torch made the worker's 3 threads, so in all of them (agentrl.runtime.denormals)
        assert ray.get([w.denormals_flushed.remote() for w in guided_group.workers]) == [True, True]

    def test_expert_guidance_through_workers(self, guided_group):
        # a random model never wins, so both groups (one per worker) get the expert's episode, played on
        # that worker's pool instances; trajectory ids stay unique across the workers. The workers
        # record BiPACE's hidden state (layer 1) for every row, the expert's included
        from agentrl.rollout.guidance import GUIDED_TRAJ_ID_BASE

        tasks = [TaskRef("depth2", 1), TaskRef("depth2", 2)]
        result = guided_group.run(tasks, group_size=2, seed=1, expert_guidance=True)
        assert [e.won for e in result.episodes] == [False] * 4 and len(result.episodes) == 4
        assert result.stats["guided_episodes"] == 2
        batch = result.batch
        guided = batch.traj_id >= GUIDED_TRAJ_ID_BASE
        assert sorted(set(batch.traj_id[guided].tolist())) == [GUIDED_TRAJ_ID_BASE, GUIDED_TRAJ_ID_BASE + 1]
        assert torch.equal(batch.group_id[guided], batch.traj_id[guided] - GUIDED_TRAJ_ID_BASE)
        assert bool(batch.success[guided].all()) and not batch.success[~guided].any()
        assert all(batch.action_valid[guided].tolist())
        assert batch.hidden is not None and batch.hidden.shape[0] == len(batch) and bool(batch.hidden.isfinite().all())
