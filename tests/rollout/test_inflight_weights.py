"""Weights that reach a rollout worker in the middle of a rollout (trainer.mode=async): with
``rollout.weights_between_tokens=false`` they are loaded at the next env step boundary, the steps
after it carry the new policy version and were sampled from the new weights, and the steps before
it from the old ones; with it on (the default) the response being generated finishes on the new
weights, each token's version recorded (StepBatch.response_versions)."""

from __future__ import annotations

import time

import pytest
import torch

from agentrl.envs import TaskRef
from agentrl.models import build_tiny_model
from agentrl.rollout.worker_group import RolloutWorkerGroup
from agentrl.rollout.worker_calls import WEIGHTS_GROUP
from rollout_helpers import TINY, check_logprobs_match, env_config, rollout_config

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def wait_until_generating(worker, mid_response: bool, timeout_s: float = 60.0) -> None:
    """Until the rollout call has passed its first step boundary (it generates step 0 or later), so
    that weights sent now are loaded at a later boundary: ``rolling_out`` alone is true before the
    first boundary, where staged weights would be loaded for every step (a loaded machine saw that).
    ``mid_response``: also until a token of this generate call was sampled (weights that arrive
    before its first token are rightly that token's already)."""
    def status():
        return ray.get(worker.status.options(concurrency_group=WEIGHTS_GROUP).remote())

    deadline = time.time() + timeout_s
    while not (now := status())["doing"].startswith("generating"):
        assert time.time() < deadline, "the rollout call never reached its first generate"
        time.sleep(0.01)
    tokens = now["generated_tokens"]
    while mid_response and status()["generated_tokens"] == tokens:
        assert time.time() < deadline, "the generate call never sampled a token"
        time.sleep(0.002)


def rollout_with_weights_arriving(tiny_model_dir, second, between_tokens: bool, sends: int = 1,
                                  response_tokens: int = 4):
    """A long greedy rollout of one group; the second model's weights sent ``sends`` times while it
    generates (versions 5, 6, ...)."""
    # a random policy rarely finishes a TextCraft task, so its episodes run to max_steps: a long call
    env_cfg = env_config("textcraft", max_steps=300, group_size=2, tasks_per_iteration=1)
    cfg = rollout_config(max_response_tokens=response_tokens, max_prompt_tokens=256, prompt_truncation="left",
                         temperature=0.0, weights_between_tokens=between_tokens)
    with RolloutWorkerGroup(tiny_model_dir, cfg, env_cfg, num_workers=1, worker_num_cpus=0.5, env_num_cpus=0.5) as group:
        pending = group.submit([TaskRef("depth2", 3)], group_size=2, seed=1, first_group_id=4)
        for version in range(5, 5 + sends):
            wait_until_generating(group.workers[0], mid_response=between_tokens)
            group.load_weights(second.state_dict(), version=version)  # returns once staged, not after the rollout
            time.sleep(0.05)
        assert not pending.done(), "the rollout call ended before the weights arrived; make it longer"
        result = pending.result()
        status = ray.get(group.workers[0].status.remote())
    return result.batch, status


def test_weights_arriving_during_a_rollout_are_loaded_between_env_steps(ray_cluster, tiny_model_dir, tiny_tokenizer):
    first = build_tiny_model(TINY, tiny_tokenizer, seed=0).eval()     # what tiny_model_dir holds
    second = build_tiny_model(TINY, tiny_tokenizer, seed=11).eval()
    batch, status = rollout_with_weights_arriving(tiny_model_dir, second, between_tokens=False)
    assert batch.response_versions is None
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


def token_logprobs(model, batch, row) -> torch.Tensor:
    p, r = int(batch.prompt_lengths[row]), int(batch.response_mask[row].sum())
    ids = torch.cat([batch.prompt_ids[row, :p], batch.response_ids[row, :r]])[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, p - 1:-1].float(), -1)
    return logp.gather(-1, ids[0, p:, None]).squeeze(-1)


def test_weights_arriving_during_a_response_finish_it_on_the_new_weights(ray_cluster, tiny_model_dir, tiny_tokenizer):
    first = build_tiny_model(TINY, tiny_tokenizer, seed=0).eval()
    second = build_tiny_model(TINY, tiny_tokenizer, seed=11).eval()
    # long responses, and the weights sent (as versions 5, 6, 7) three times while the worker generates
    batch, status = rollout_with_weights_arriving(tiny_model_dir, second, between_tokens=True, sends=3,
                                                  response_tokens=32)
    assert status["policy_version"] == 7 and batch.response_versions is not None
    tokens = batch.token_versions()
    mask = batch.response_mask > 0
    assert 0 in set(tokens[mask].tolist()) and 7 in set(tokens[mask].tolist())
    # a row's first token is its policy_version; within a response versions never go back
    assert torch.equal(tokens[:, 0], batch.policy_version)
    switched = [row for row in range(len(batch)) if len(set(tokens[row][mask[row]].tolist())) > 1]
    assert switched, "no response was being generated when the weights arrived"
    for row in switched:    # old tokens, then new ones, each from the model of its version
        versions = tokens[row][mask[row]]
        assert bool((versions == torch.sort(versions).values).all())
        logprobs = batch.rollout_logprobs[row][mask[row]]
        for model, which in ((first, versions == 0), (second, versions >= 5)):
            assert torch.allclose(token_logprobs(model, batch, row)[which], logprobs[which], atol=1e-4), row
    check_logprobs_match(second, batch, (batch.policy_version == 7).nonzero().flatten().tolist()[-3:])
