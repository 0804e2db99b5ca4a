"""DAgger demonstrations (agentrl.warmstart.dagger): the states are the rollout's, the labels the expert's."""

from __future__ import annotations

import pytest

from agentrl.envs import TaskRef, make_env
from agentrl.envs.server import EnvClient
from agentrl.generation import TorchBackend
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.parsing import parse_response
from agentrl.rollout.prompts import render_chat

from rollout_helpers import env_config, rollout_config

MAX_STEPS = 6


@pytest.fixture(scope="module")
def search_pool(alfworld_search_games) -> dict:
    return {"data_dir": alfworld_search_games, "room_in_task": True, "unvisited_in_task": True, "max_steps": MAX_STEPS}


def _cfg():
    return rollout_config(max_response_tokens=16, max_prompt_tokens=4096, enable_thinking=False,
                          prompt_style="compact_task_last", show_admissible=False)


@pytest.mark.parametrize("history", [2, 0])
def test_dagger_labels_every_distinct_state_of_the_greedy_rollout(search_pool, tiny_model_dir, tiny_tokenizer,
                                                                  history):
    """With no history in the prompt, a policy whose actions fail sees one prompt again and again."""
    from agentrl.warmstart.dagger import policy_demonstrations

    order = [2, 0, 1]
    result = policy_demonstrations("alfworld", search_pool, "train", order, model_dir=tiny_model_dir,
                                   rollout_cfg=_cfg(), history_length=history, count_repeats=False,
                                   max_steps=MAX_STEPS, batch=2)
    # the same policy through the rollout engine, greedy: the same episodes
    engine = RolloutEngine(TorchBackend.from_pretrained(tiny_model_dir), tiny_tokenizer,
                           EnvClient.local("alfworld", 3, search_pool), _cfg(),
                           env_config("alfworld", max_steps=MAX_STEPS, history_length=history), record_transcripts=True)
    played = engine.run([TaskRef("train", i) for i in order], 1, sampling=engine.sampling_params(temperature=0.0))
    assert result.episodes == 3 and result.states == len(played.batch) == sum(e.length for e in played.episodes)
    assert result.won == sum(e.won for e in played.episodes) and result.unlabelled == 0
    batch = played.batch
    env = make_env("alfworld", **search_pool)
    kept = 0
    for episode in played.episodes:
        rows = (batch.traj_id == episode.traj_id).nonzero().flatten().tolist()
        prompts = [tiny_tokenizer.decode(batch.prompt_ids[r, :batch.prompt_lengths[r]]) for r in rows]
        distinct = list(dict.fromkeys(prompts))
        demos = [d for d in result.demonstrations if d.task == episode.task]
        # one demonstration per distinct prompt the rollout showed, in order, each marked as DAgger's
        assert [render_chat(tiny_tokenizer, d.prompt) for d in demos] == distinct
        assert all(d.dagger and not d.recovery for d in demos)
        # its label is the env expert's answer in that state: replay the rollout's actions
        env.reset(episode.task)
        labels = {}
        for prompt, step in zip(prompts, episode.transcript[:-1]):
            labels.setdefault(prompt, env.expert_next_action())
            env.step(step["action"])
        assert [parse_response(d.response, "alfworld").action for d in demos] == [labels[p] for p in distinct]
        kept += len(demos)
    assert kept == len(result.demonstrations) and result.disagreements >= 1
    if history == 0:
        assert kept < result.states
        return
    # in two processes: the same demonstrations in the same order
    again = policy_demonstrations("alfworld", search_pool, "train", order, model_dir=tiny_model_dir,
                                  rollout_cfg=_cfg(), history_length=2, count_repeats=False, max_steps=MAX_STEPS,
                                  batch=2, workers=2)
    assert again.demonstrations == result.demonstrations and again.summary() == result.summary()


def test_dagger_on_an_env_without_a_step_wise_expert_is_an_error(tiny_model_dir):
    from agentrl.warmstart.dagger import policy_demonstrations

    from agentrl.errors import UsageError

    with pytest.raises(UsageError, match="trainer.sft.dagger.tasks=0"):
        policy_demonstrations("textcraft", {"max_steps": 3}, "depth2", [0], model_dir=tiny_model_dir,
                              rollout_cfg=rollout_config(), history_length=2, count_repeats=False, max_steps=3)
