"""Expert guidance (rollout.expert_guidance): groups that failed in every rollout get the expert's episode."""

from __future__ import annotations

import pytest
import torch

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.estimators import compute_advantages
from agentrl.models import stop_token_ids
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.guidance import GUIDED_TRAJ_ID_BASE, expert_response

from rollout_helpers import env_config, rollout_config
from scripted_backend import ScriptedExpertBackend, expert_plans

TASKS = [TaskRef("depth2", 0), TaskRef("depth2", 3)]


class SolvesOnly(ScriptedExpertBackend):
    """Plays the expert on the tasks it has plans for and asks for the inventory on the others."""

    def __init__(self, tokenizer, plans, solved_tasks):
        super().__init__(tokenizer, plans)
        self.solved = {t for t in plans if t in solved_tasks}

    def _respond(self, prompt: str) -> str:
        if any(t in prompt for t in self.solved):
            return super()._respond(prompt)
        return "<think>look</think><action>inventory</action>"


def _rollout_config(**overrides):
    return rollout_config(**{"max_response_tokens": 64, **overrides})


def _engine(backend, tokenizer, env_cfg, rollout_cfg, size=4):
    client = EnvClient.local(env_cfg.name, size, {"max_steps": env_cfg.max_steps})
    return RolloutEngine(backend, tokenizer, client, rollout_cfg, env_cfg)


def test_all_failed_groups_get_the_experts_episode(tiny_tokenizer):
    env_cfg = env_config(max_steps=15, success_reward=10.0)
    plans = expert_plans("textcraft", TASKS)
    solved = [next(iter(plans))]                       # task 0 is solved, task 3 fails in both rollouts
    engine = _engine(SolvesOnly(tiny_tokenizer, plans, solved), tiny_tokenizer, env_cfg, _rollout_config())
    plain = engine.run(TASKS, group_size=2, group_ids=[7, 8])
    guided = engine.run(TASKS, group_size=2, group_ids=[7, 8], expert_guidance=True)

    # the sampled episodes and their records are the same with and without guidance
    assert [(e.traj_id, e.won) for e in guided.episodes] == [(e.traj_id, e.won) for e in plain.episodes]
    assert [e.won for e in guided.episodes] == [True, True, False, False]
    sampled = guided.batch.traj_id < GUIDED_TRAJ_ID_BASE
    width = plain.batch.response_ids.shape[1]
    assert torch.equal(guided.batch.response_ids[sampled, :width], plain.batch.response_ids)
    assert not guided.batch.response_mask[sampled, width:].any()
    assert guided.stats["guided_groups"] == 1 and guided.stats["guided_episodes"] == 1
    assert "guided_groups" not in plain.stats

    rows = (~sampled).nonzero().flatten()
    batch = guided.batch
    plan = plans[next(t for t in plans if t not in solved)]
    assert set(batch.traj_id[rows].tolist()) == {GUIDED_TRAJ_ID_BASE + 8}
    assert set(batch.group_id[rows].tolist()) == {8}
    assert batch.step[rows].tolist() == list(range(len(plan)))
    assert [batch.action[int(r)] for r in rows] == plan
    assert batch.reward[rows].tolist() == [0.0] * (len(plan) - 1) + [10.0]
    assert batch.done[rows].tolist() == [False] * (len(plan) - 1) + [True]
    assert bool(batch.success[rows].all()) and torch.allclose(batch.episode_return[rows], torch.tensor(10.0))
    assert guided.stats["guided_steps"] == len(plan)
    stop = stop_token_ids(tiny_tokenizer)[0]
    for k, r in enumerate(rows.tolist()):
        # the response the policy would write for the expert's action, then the stop token
        n = int(batch.response_mask[r].sum())
        want = tiny_tokenizer(expert_response("textcraft", plan[k], think=True),
                              add_special_tokens=False)["input_ids"] + [stop]
        assert batch.response_ids[r, :n].tolist() == want
        assert not batch.rollout_logprobs[r].any()
    # its prompts are the ones a policy playing the same actions sees (history window, style)
    expert_run = _engine(ScriptedExpertBackend(tiny_tokenizer, plans), tiny_tokenizer, env_cfg,
                         _rollout_config()).run([TASKS[1]], group_size=1)
    first = expert_run.batch
    assert first.prompt_ids.shape[1] <= batch.prompt_ids.shape[1]
    for k, r in enumerate(rows.tolist()):
        p = int(first.prompt_lengths[k])
        assert int(batch.prompt_lengths[r]) == p
        assert torch.equal(batch.prompt_ids[r, :p], first.prompt_ids[k, :p])
        assert batch.anchor_obs[r] == first.anchor_obs[k]
    # a guided state shared with the sampled rollouts (the first observation) shares their anchor key
    group_rows = (batch.group_id == 8).nonzero().flatten()
    start = group_rows[batch.step[group_rows] == 0]
    assert len(set(batch.anchor_key[start].tolist())) == 1


def test_guidance_gives_the_failed_group_a_spread_of_returns(tiny_tokenizer):
    env_cfg = env_config(max_steps=15, success_reward=10.0)
    plans = expert_plans("textcraft", TASKS)
    engine = _engine(SolvesOnly(tiny_tokenizer, plans, []), tiny_tokenizer, env_cfg,
                     _rollout_config(invalid_action_penalty=0.0))
    plain = engine.run(TASKS, group_size=2)
    guided = engine.run(TASKS, group_size=2, expert_guidance=True)
    adv_plain, _ = compute_advantages("grpo", plain.batch, norm_by_std=False)
    assert not adv_plain.any()                          # every episode failed: nothing to learn
    adv, _ = compute_advantages("grpo", guided.batch, norm_by_std=False)
    expert = guided.batch.traj_id >= GUIDED_TRAJ_ID_BASE
    assert guided.stats["guided_episodes"] == 2
    assert (adv[expert] > 0).all() and (adv[~expert] < 0).all()
    # the group's mean return is taken over its step rows (episode_stats=steps, the reference code's)
    rows = guided.batch.group_id == guided.batch.group_id[expert][0]
    mean = guided.batch.episode_return[rows].double().mean().item()
    assert adv[expert][0].item() == pytest.approx(10.0 - mean, rel=1e-5)


def test_an_expert_response_longer_than_the_limit_adds_nothing(tiny_tokenizer):
    env_cfg = env_config(max_steps=15)
    plans = expert_plans("textcraft", TASKS)
    engine = _engine(SolvesOnly(tiny_tokenizer, plans, []), tiny_tokenizer, env_cfg,
                     rollout_config(max_response_tokens=4))
    result = engine.run(TASKS, group_size=2, expert_guidance=True)
    assert result.stats["guided_groups"] == 2 and result.stats["guided_episodes"] == 0
    assert result.stats["guided_dropped"] == 2
    assert (result.batch.traj_id < GUIDED_TRAJ_ID_BASE).all()


def test_the_sampled_rows_of_guided_groups(tiny_tokenizer):
    from agentrl.rollout.guidance import sampled_rows_of_guided_groups

    env_cfg = env_config(max_steps=15)
    plans = expert_plans("textcraft", TASKS)
    solved = [next(iter(plans))]
    engine = _engine(SolvesOnly(tiny_tokenizer, plans, solved), tiny_tokenizer, env_cfg, _rollout_config())
    batch = engine.run(TASKS, group_size=2, group_ids=[7, 8], expert_guidance=True).batch
    mask = sampled_rows_of_guided_groups(batch)
    assert torch.equal(mask, (batch.group_id == 8) & (batch.traj_id < GUIDED_TRAJ_ID_BASE))
    assert mask.sum() == 2 * 15                       # two failed episodes of 15 steps each
    plain = engine.run(TASKS, group_size=2, group_ids=[7, 8]).batch
    assert not sampled_rows_of_guided_groups(plain).any()


def test_a_failing_expert_solver_drops_the_guidance_not_the_rollout(tiny_tokenizer, monkeypatch):
    from agentrl.envs.server import EnvServerError

    env_cfg = env_config(max_steps=15)
    plans = expert_plans("textcraft", TASKS)
    engine = _engine(SolvesOnly(tiny_tokenizer, plans, []), tiny_tokenizer, env_cfg, _rollout_config())

    def broken(*args, **kwargs):
        raise EnvServerError("instance 0: expert_actions raised KeyError: 'goal'")

    monkeypatch.setattr(engine.client, "expert_actions", broken)
    result = engine.run(TASKS, group_size=2, expert_guidance=True)
    assert len(result.episodes) == 4 and (result.batch.traj_id < GUIDED_TRAJ_ID_BASE).all()
    assert result.stats["guided_groups"] == 2 and result.stats["guided_dropped"] == 2


def test_recorded_hidden_states_cover_sampled_and_guided_rows(tiny_model_dir, tiny_tokenizer):
    """With the torch backend recording hidden states (BiPACE), every row of the batch, the
    expert's guided rows included, carries HF's hidden state at its prompt's last token."""
    from agentrl.models import load_model
    from agentrl.generation import TorchBackend

    env_cfg = env_config(max_steps=15)
    backend = TorchBackend.from_pretrained(tiny_model_dir)
    engine = _engine(backend, tiny_tokenizer, env_cfg,
                     _rollout_config(max_prompt_tokens=512, prompt_truncation="left"))
    assert engine.run(TASKS, group_size=2, seed=1, expert_guidance=True).batch.hidden is None
    assert backend.record_hidden(1)
    result = engine.run(TASKS, group_size=2, seed=1, expert_guidance=True)
    batch = result.batch
    guided = batch.traj_id >= GUIDED_TRAJ_ID_BASE
    assert guided.any() and (~guided).any(), {k: v for k, v in result.stats.items() if "guid" in k}   # the random model never wins: both groups guided
    assert batch.hidden is not None and batch.hidden.shape == (len(batch), backend.model.config.hidden_size)
    model = load_model(tiny_model_dir)
    with torch.no_grad():
        for row in range(len(batch)):
            prompt = batch.prompt_ids[row, :int(batch.prompt_lengths[row])]
            expected = model(prompt[None], output_hidden_states=True).hidden_states[1][0, -1]
            assert torch.allclose(batch.hidden[row], expected, atol=1e-5), row
