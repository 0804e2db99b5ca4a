"""The rollout engine in-process (local env pool): record contents, rewards, penalties, truncation."""

from __future__ import annotations

import re

import pytest
import torch

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.models import load_model, stop_token_ids
from agentrl.generation import TorchBackend
from agentrl.rollout.engine import PromptTooLongError, RolloutEngine
from agentrl.rollout.validation import eval_tasks, validate
from agentrl.training.metrics import episode_metrics

from rollout_helpers import env_config, rollout_config
from scripted_backend import NOOP_ACTION, ScriptedExpertBackend, expert_plans

TASKS = [TaskRef("depth2", 0), TaskRef("depth2", 3)]


def _engine(backend, tokenizer, env_cfg, rollout_cfg, size):
    client = EnvClient.local(env_cfg.name, size, {"max_steps": env_cfg.max_steps})
    return RolloutEngine(backend, tokenizer, client, rollout_cfg, env_cfg)


def test_expert_rollout_records_rewards_history_and_ids(tiny_tokenizer):
    env_cfg = env_config(max_steps=15, history_length=2, success_reward=10.0)
    plans = expert_plans("textcraft", TASKS)
    backend = ScriptedExpertBackend(tiny_tokenizer, plans, invalid_steps=[1])
    engine = _engine(backend, tiny_tokenizer, env_cfg, rollout_config(invalid_action_penalty=0.25), 4)
    result = engine.run(TASKS, group_size=2)
    batch = result.batch

    assert [e.won for e in result.episodes] == [True] * 4
    assert torch.equal(batch.group_id, batch.traj_id // 2)  # G = 2 consecutive trajectories per task
    assert sorted(set(batch.traj_id.tolist())) == [0, 1, 2, 3]
    for ep in result.episodes:
        rows = (batch.traj_id == ep.traj_id).nonzero().flatten().tolist()
        plan = plans[next(t for t in plans if t in tiny_tokenizer.decode(batch.prompt_ids[rows[0]]))]
        # step 1 is answered without tags: penalised, and the plan is one step longer
        assert ep.length == len(plan) + 1 == len(rows)
        assert batch.step[rows].tolist() == list(range(len(rows)))
        rewards = batch.reward[rows].tolist()
        assert rewards[1] == pytest.approx(-0.25) and rewards[-1] == pytest.approx(10.0)
        assert all(r == 0 for i, r in enumerate(rewards) if i not in (1, len(rows) - 1))
        assert batch.action_valid[rows].tolist() == [i != 1 for i in range(len(rows))]
        assert batch.action[rows[1]] == "" and batch.action[rows[0]] == plan[0]
        assert batch.done[rows].tolist() == [False] * (len(rows) - 1) + [True]
        assert ep.episode_return == pytest.approx(10.0 - 0.25) and ep.invalid_actions == 1
        assert torch.allclose(batch.episode_return[rows], torch.tensor(ep.episode_return))
        assert bool(batch.success[rows].all())
        assert batch.anchor_obs[rows[0]].startswith("Crafting commands:")
        # the prompt at step 3 shows the last two (observation, action) pairs, not the first
        prompt3 = tiny_tokenizer.decode(batch.prompt_ids[rows[3], :batch.prompt_lengths[rows[3]]])
        assert "Last 2 of 3 steps" in prompt3 and f"Observation: {batch.anchor_obs[rows[3]]}" in prompt3
        assert f"Action 3: '{plan[1]}'" in prompt3 and "Observation 1:" not in prompt3
        assert prompt3.startswith("<|im_start|>user\n") and prompt3.endswith("<|im_start|>assistant\n")
    assert batch.response_mask.shape == batch.response_ids.shape == batch.rollout_logprobs.shape
    lengths = batch.response_mask.sum(1)
    stop = stop_token_ids(tiny_tokenizer)[0]
    assert all(int(batch.response_ids[i, int(n) - 1]) == stop for i, n in enumerate(lengths))
    assert result.stats["env_steps"] == len(batch) and result.stats["invalid_actions"] == 4


@pytest.mark.parametrize("noop_penalty", [0.0, 0.5])
def test_noop_penalty_charges_well_formed_actions_that_change_nothing(tiny_tokenizer, noop_penalty):
    env_cfg = env_config(max_steps=15, history_length=2, success_reward=10.0)
    plans = expert_plans("textcraft", TASKS)
    backend = ScriptedExpertBackend(tiny_tokenizer, plans, invalid_steps=[1], noop_steps=[2])
    rollout_cfg = rollout_config(invalid_action_penalty=0.25, noop_penalty=noop_penalty)
    result = _engine(backend, tiny_tokenizer, env_cfg, rollout_cfg, 4).run(TASKS, group_size=2)
    batch = result.batch
    assert [e.won for e in result.episodes] == [True] * 4
    for ep in result.episodes:
        rows = (batch.traj_id == ep.traj_id).nonzero().flatten().tolist()
        # step 1 has no tags (invalid: only the format penalty), step 2 a well-formed command TextCraft rejects
        assert batch.action[rows[2]] == NOOP_ACTION and bool(batch.action_valid[rows[2]])
        # the step after the no-op: its prompt shows the reply, and the reply is its anchor observation
        prompt3 = tiny_tokenizer.decode(batch.prompt_ids[rows[3], :batch.prompt_lengths[rows[3]]])
        assert f"Observation: Could not execute {NOOP_ACTION}" in prompt3
        assert batch.anchor_obs[rows[3]] == f"Could not execute {NOOP_ACTION}"
        assert batch.anchor_obs[rows[4]] != batch.anchor_obs[rows[3]]
        rewards = batch.reward[rows].tolist()
        assert rewards[1] == pytest.approx(-0.25) and rewards[2] == pytest.approx(-noop_penalty)
        # each part in its own column: the env's reward, the format penalty, the no-op penalty
        assert batch.env_reward[rows].tolist() == [0.0] * (len(rows) - 1) + [10.0]
        assert batch.invalid_penalty[rows].tolist() == pytest.approx([0.0, 0.25] + [0.0] * (len(rows) - 2))
        assert batch.noop_penalty[rows].tolist() == pytest.approx([0.0, 0.0, noop_penalty] + [0.0] * (len(rows) - 3))
        assert not batch.is_expert.any() and (batch.policy_version == 0).all()
        assert ep.episode_return == pytest.approx(10.0 - 0.25 - noop_penalty)
    # counted whether or not it is charged; the expert's own commands never are
    assert result.stats["noop_actions"] == 4 and result.stats["invalid_actions"] == 4
    metrics = episode_metrics(result)     # what the trainer logs per iteration
    assert metrics["rollout/noop_actions"] == 4
    assert metrics["rollout/noop_rate"] == pytest.approx(4 / result.stats["env_steps"]) and result.stats["env_steps"] > 8


def test_counted_history_reaches_the_prompts_the_policy_answers(tiny_tokenizer):
    # pool task 0 is the respawn anchor: get obsidian, get dust, craft glowstone three times, craft the anchor
    task = TaskRef("pool_depth2", 0)
    env_cfg = env_config(max_steps=12, history_length=2, history_count_repeats=True)
    plans = expert_plans("textcraft", [task])
    (plan,) = plans.values()
    engine = _engine(ScriptedExpertBackend(tiny_tokenizer, plans), tiny_tokenizer, env_cfg,
                     rollout_config(max_prompt_tokens=2048), 1)
    result = engine.run([task], group_size=1)
    batch = result.batch
    assert result.episodes[0].won and plan[2] == plan[3] == plan[4] != plan[5]
    last = tiny_tokenizer.decode(batch.prompt_ids[5, :batch.prompt_lengths[5]])
    assert f"Actions 3-5: '{plan[2]}' (3 times)]" in last and "Last 4 of 5 steps" in last
    # the craft in progress reads as done twice, not three times
    before = tiny_tokenizer.decode(batch.prompt_ids[4, :batch.prompt_lengths[4]])
    assert f"Actions 3-4: '{plan[2]}' (2 times)]" in before


def test_random_model_rollout_is_penalised_and_seeded(tiny_model_dir, tiny_tokenizer):
    env_cfg = env_config(max_steps=2)
    backend = TorchBackend.from_pretrained(tiny_model_dir)
    cfg = rollout_config(max_response_tokens=8, max_prompt_tokens=512, prompt_truncation="left")
    engine = _engine(backend, tiny_tokenizer, env_cfg, cfg, 4)
    first = engine.run(TASKS, group_size=2, seed=5)
    again = engine.run(TASKS, group_size=2, seed=5)
    other = engine.run(TASKS, group_size=2, seed=6)
    batch = first.batch
    assert len(batch) == 4 * 2 and not batch.action_valid.any()
    assert torch.allclose(batch.reward, torch.full((len(batch),), -0.1))
    assert torch.equal(batch.response_ids, again.batch.response_ids)
    assert torch.equal(batch.rollout_logprobs, again.batch.rollout_logprobs)
    assert not torch.equal(batch.response_ids, other.batch.response_ids)
    mask = batch.response_mask.bool()
    assert (batch.rollout_logprobs[mask] < 0).all() and (batch.rollout_logprobs[~mask] == 0).all()
    # rollout log-probs are the model's own (temperature 1) log-probs of the sampled tokens
    model = load_model(tiny_model_dir)
    row = 6
    p, r = int(batch.prompt_lengths[row]), int(batch.response_mask[row].sum())
    ids = torch.cat([batch.prompt_ids[row, :p], batch.response_ids[row, :r]])[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, p - 1:-1].float(), -1)
    ref = logp.gather(-1, ids[0, p:, None]).squeeze(-1)
    assert torch.allclose(ref, batch.rollout_logprobs[row, :r], atol=1e-4)


def test_env_reward_mode_and_waves(tiny_tokenizer):
    env_cfg = env_config(max_steps=15, reward="env")
    tasks = TASKS + [TaskRef("depth2", 7)]
    engine = _engine(ScriptedExpertBackend(tiny_tokenizer, expert_plans("textcraft", tasks)), tiny_tokenizer,
                     env_cfg, rollout_config(), 4)  # 3 groups of 2 on 4 instances: two waves
    result = engine.run(tasks, group_size=2, group_ids=[10, 11, 12], traj_id_start=100)
    assert sorted({e.traj_id for e in result.episodes}) == list(range(100, 106))
    assert sorted(set(result.batch.group_id.tolist())) == [10, 11, 12]
    last = result.batch.trajectory_rows()
    assert torch.allclose(result.batch.reward[last], torch.ones(6))  # TextCraft's own reward: 1 on success
    assert result.success_rate == 1.0
    assert_anchor_keys_number_each_groups_observations(result.batch)


def assert_anchor_keys_number_each_groups_observations(batch):
    """Within a group, equal anchor_obs <=> equal anchor_key, numbered 0, 1, ... by first appearance
    (the rows of a wave, ordered by trajectory and step)."""
    assert batch.anchor_key is not None
    keys = batch.anchor_key.tolist()
    for g in set(batch.group_id.tolist()):
        rows = (batch.group_id == g).nonzero().flatten().tolist()
        number = {}
        for i in rows:
            assert number.setdefault(batch.anchor_obs[i], keys[i]) == keys[i], (g, i)
        assert sorted(number.values()) == list(range(len(number)))   # distinct observations, distinct keys


def test_prompt_truncation_error_and_left(tiny_tokenizer):
    env_cfg = env_config()
    plans = expert_plans("textcraft", TASKS[:1])
    strict = _engine(ScriptedExpertBackend(tiny_tokenizer, plans), tiny_tokenizer, env_cfg,
                     rollout_config(max_prompt_tokens=64), 2)
    with pytest.raises(PromptTooLongError, match="max_prompt_tokens=64"):
        strict.run(TASKS[:1], group_size=1)
    seen = []

    class Recording(ScriptedExpertBackend):
        def generate(self, prompt_ids, sampling):
            seen.extend(prompt_ids)
            return [g for g in super().generate([[0]] * len(prompt_ids), sampling)]

        def _respond(self, prompt):
            return "<think>x</think><action>inventory</action>"

    left = _engine(Recording(tiny_tokenizer, plans), tiny_tokenizer, env_cfg,
                   rollout_config(max_prompt_tokens=64, prompt_truncation="left"), 2)
    result = left.run(TASKS[:1], group_size=1)
    assert all(len(p) == 64 for p in seen) and result.stats["truncated_prompts"] == len(seen)
    assert tiny_tokenizer.decode(seen[0]).endswith("<|im_start|>assistant\n")  # the end is kept
    assert int(result.batch.prompt_lengths.max()) == 64


def test_validation_runs_group_size_one_and_reports_success(tiny_tokenizer):
    env_cfg = env_config(max_steps=15)
    tasks = eval_tasks({"depth2": 291}, "depth2", num_tasks=3)
    assert tasks == [TaskRef("depth2", i) for i in range(3)]
    engine = _engine(ScriptedExpertBackend(tiny_tokenizer, expert_plans("textcraft", tasks)), tiny_tokenizer,
                     env_cfg, rollout_config(), 2)
    result = validate(engine, tasks, temperature=0.0)
    assert len(result.episodes) == 3 and {e.group_id for e in result.episodes} == {0, 1, 2}
    assert result.success_rate == 1.0 and result.success_by_type == {"depth2": 1.0}
    assert result.metrics()["val/success_rate"] == 1.0 and result.invalid_action_rate == 0.0
    assert re.fullmatch(r"\d+\.\d+", f"{result.mean_length:.1f}") and result.mean_length > 1


def test_alfworld_unvisited_notes_reach_the_prompts_of_policy_guidance_and_sft(tiny_tokenizer, tmp_path):
    """ALFWorld's ``unvisited_in_task`` rewrites ``info["task"]`` after every step: the rollout's
    prompts, the guided expert episode's and the SFT demonstrations' all show the current notes."""
    pytest.importorskip("alfworld")
    from agentrl.warmstart.demonstrations import expert_episodes
    from agentrl_env_alfworld.expert import listed_receptacles, observed_receptacle
    from agentrl_env_alfworld.generate import generate_dataset
    from agentrl.rollout.guidance import GUIDED_TRAJ_ID_BASE
    from agentrl.rollout.prompts import render_chat

    generate_dataset(str(tmp_path), {"train": 1}, seed=3, workers=1, solver="search",
                     task_types=("pick_and_place_simple",), rooms=("bathroom",))
    kwargs = {"data_dir": str(tmp_path), "room_in_task": True, "unvisited_in_task": True, "max_steps": 25}
    task = TaskRef("train", 0)
    env_cfg = env_config("alfworld", max_steps=25, history_length=2)
    cfg = rollout_config(max_response_tokens=64, max_prompt_tokens=4096, enable_thinking=False,
                         prompt_style="compact_task_last", show_admissible=False)
    ((reset_task, plan),) = expert_plans("alfworld", [task], kwargs).items()
    goal = reset_task.split("\n")[-1]          # the one task line every step's prompt shows unchanged

    def rollout(backend, **run):
        engine = RolloutEngine(backend, tiny_tokenizer, EnvClient.local("alfworld", 2, kwargs), cfg, env_cfg)
        return engine.run([task], **run)

    def prompts(batch, rows):
        return [tiny_tokenizer.decode(batch.prompt_ids[r, :batch.prompt_lengths[r]]) for r in rows]

    played = rollout(ScriptedExpertBackend(tiny_tokenizer, {goal: plan}), group_size=1)
    assert played.episodes[0].won and len(played.batch) == len(plan)
    shown = prompts(played.batch, range(len(plan)))
    listed = listed_receptacles(reset_task)
    for k, text in enumerate(shown):
        notes = next(line for line in text.split("\n") if line.startswith("Not visited yet: "))
        been = {observed_receptacle(played.batch.anchor_obs[j]) for j in range(k + 1)} - {None}
        assert notes == "Not visited yet: " + (", ".join(r for r in listed if r not in been) or "none") + "."
    assert len({line for text in shown for line in text.split("\n") if line.startswith("Not visited")}) > 2
    # SFT's demonstrations of the same episode are the same prompts
    demos = list(expert_episodes("alfworld", kwargs, "train", [0], history_length=2, think=False,
                                 style="compact_task_last", show_admissible=False))
    assert [render_chat(tiny_tokenizer, d.prompt) for d in demos] == shown

    class Lost(ScriptedExpertBackend):       # never acts: its group fails and gets the expert's episode
        def _respond(self, prompt: str) -> str:
            return "<action>look</action>"

    guided = rollout(Lost(tiny_tokenizer, {}), group_size=2, expert_guidance=True)
    rows = (guided.batch.traj_id >= GUIDED_TRAJ_ID_BASE).nonzero().flatten().tolist()
    assert len(rows) == len(plan) and prompts(guided.batch, rows) == shown
