"""Weights that reach a rollout worker in the middle of a rollout (trainer.mode=async): they are
loaded at the next env step boundary, the steps after it carry the new policy version and were
sampled from the new weights, and the steps before it from the old ones."""

from __future__ import annotations

import time

import pytest
import torch

from agentrl.envs import TaskRef
from agentrl.models import build_tiny_model
from agentrl.rollout.workers import WEIGHTS_GROUP, RolloutWorkerGroup
from rollout_helpers import TINY, check_logprobs_match, env_config, rollout_config

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def wait_until_generating(worker, timeout_s: float = 60.0) -> None:
    """Until the rollout call has passed its first step boundary (it generates step 0 or later), so
    that weights sent now are loaded at a later boundary: ``rolling_out`` alone is true before the
    first boundary, where staged weights would be loaded for every step (a loaded machine saw that)."""
    deadline = time.time() + timeout_s
    while not ray.get(worker.status.options(concurrency_group=WEIGHTS_GROUP).remote())["doing"].startswith("generating"):
        assert time.time() < deadline, "the rollout call never reached its first generate"
        time.sleep(0.01)


def test_weights_arriving_during_a_rollout_are_loaded_between_env_steps(ray_cluster, tiny_model_dir, tiny_tokenizer):
    # a random policy rarely finishes a TextCraft task, so its episodes run to max_steps: a long call
    env_cfg = env_config("textcraft", max_steps=300, group_size=2, tasks_per_iteration=1)
    cfg = rollout_config(max_response_tokens=4, max_prompt_tokens=256, prompt_truncation="left", temperature=0.0)
    first = build_tiny_model(TINY, tiny_tokenizer, seed=0).eval()     # what tiny_model_dir holds
    second = build_tiny_model(TINY, tiny_tokenizer, seed=11).eval()
    with RolloutWorkerGroup(tiny_model_dir, cfg, env_cfg, num_workers=1, worker_num_cpus=0.5, env_num_cpus=0.5) as group:
        pending = group.submit([TaskRef("depth2", 3)], group_size=2, seed=1, first_group_id=4)
        wait_until_generating(group.workers[0])
        group.load_weights(second.state_dict(), version=5)     # returns once staged, not after the rollout
        assert not pending.done(), "the rollout call ended before the weights arrived; make it longer"
        result = pending.result()
        status = ray.get(group.workers[0].status.remote())
    batch = result.batch
    assert (status["rolling_out"], status["policy_version"], status["staged_version"], status["doing"]) == \
        (False, 5, None, "idle")
    assert sorted(set(batch.group_id.tolist())) == [4] and sorted(set(batch.traj_id.tolist())) == [8, 9]
    versions = batch.policy_version.tolist()
    assert set(versions) == {0, 5}, versions
    for traj in (8, 9):    # one switch per episode, at a step boundary: 0 ... 0 5 ... 5
        rows = (batch.traj_id == traj).nonzero().flatten()
        rows = rows[torch.argsort(batch.step[rows])]
        seq = batch.policy_version[rows].tolist()
        assert seq == sorted(seq) and seq[0] == 0 and seq[-1] == 5, seq
    old_rows = (batch.policy_version == 0).nonzero().flatten().tolist()
    new_rows = (batch.policy_version == 5).nonzero().flatten().tolist()
    check_logprobs_match(first, batch, old_rows[:3])
    check_logprobs_match(second, batch, new_rows[-3:])
