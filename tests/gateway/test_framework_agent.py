"""A LangGraph agent (agentrl.agents.textcraft_langgraph: ChatOpenAI with tools, a model node and
LangGraph's ToolNode) trained through the gateway as the rollout engine: every model call of the graph
is one StepBatch row with the ids the engine sampled, LangChain's messages (its tool calls sent back,
its tool results) are accepted and the replies it sends back keep their sampled ids; with a backend
scripted to call the tools like the expert, the episodes are won through the tool path (plain and
streamed); an episode the framework fails on (a call the gateway refuses) is counted, not raised."""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import pytest

from agentrl.config import load_config
from agentrl.envs import TaskRef, make_env
from agentrl.envs.server import EnvClient
from agentrl.rollout.agents.task import load_agent
from agentrl.rollout.agents.engine import AgentEngine
from agentrl.models import load_tokenizer
from agentrl.generation import make_backend
from agentrl.generation.base import Generation, GenerationBackend
from tiny_policy import save_tiny_policy

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")
from agentrl.agents.textcraft_langgraph import REMINDER, run_episode  # noqa: E402

TASKS = [TaskRef("train", 1), TaskRef("train", 2)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("langgraph") / "tiny"
    save_tiny_policy(out)
    return str(out)


def engine_for(model_dir, agent, *overrides, backend=None, max_steps=3):
    cfg = load_config("textcraft_grpo_tiny", [f"env.max_steps={max_steps}", "rollout.max_response_tokens=8",
                                              "rollout.max_prompt_tokens=3000", "rollout.invalid_action_penalty=0.1",
                                              *overrides])
    client = EnvClient.local("textcraft", 4, {"max_steps": max_steps})
    backend = backend or make_backend("torch", model_dir, max_model_len=3008)
    engine = AgentEngine(backend, load_tokenizer(model_dir), client, cfg.rollout, cfg.env, agent=agent)
    return engine, client


def run(engine, client, tasks=TASKS):
    try:
        return engine.run(tasks, group_size=2, seed=1)
    finally:
        engine.close()
        client.close()


def rows(batch, traj):
    return [i for i in range(len(batch)) if int(batch.traj_id[i]) == traj]


def prompt(batch, i):
    return batch.prompt_ids[i, :int(batch.prompt_lengths[i])].tolist()


def response(batch, i):
    return batch.response_ids[i][batch.response_mask[i] > 0].tolist()


def test_the_tiny_policy_plays_every_call_as_one_step(model_dir):
    """The tiny model writes no tool call: each reply is answered with a reminder, three calls an episode,
    each charged the invalid-action penalty; each prompt holds the previous prompt and the ids sampled."""
    engine, client = engine_for(model_dir, load_agent("agentrl.agents.textcraft_langgraph:run_episode"))
    result = run(engine, client)
    batch = result.batch
    assert len(result.episodes) == 4 and all(e.env_error is None for e in result.episodes)
    assert len(batch) == result.stats["env_steps"] == 12 and all(e.length == 3 for e in result.episodes)
    assert float(batch.rollout_logprobs.abs().sum()) > 0
    for traj in range(4):
        mine = rows(batch, traj)
        assert [int(batch.step[i]) for i in mine] == [0, 1, 2] and [bool(batch.done[i]) for i in mine] == [0, 0, 1]
        assert [round(float(batch.reward[i]), 4) for i in mine] == [-0.1] * 3
        assert all(batch.anchor_obs[i].startswith("Crafting commands:") for i in mine)   # the agent's anchor
        for a, b in zip(mine, mine[1:]):      # token in, token out through LangChain's messages
            assert prompt(batch, b)[:len(prompt(batch, a)) + len(response(batch, a))] == \
                prompt(batch, a) + response(batch, a)
    text = engine.tokenizer.decode(prompt(batch, rows(batch, 0)[2]))
    assert "# Tools" in text and '"name": "craft"' in text and text.count(REMINDER) == 2


def test_an_episode_the_framework_fails_on_is_counted_not_raised(model_dir):
    """Episode 0 believes it may make one call more than its budget: the gateway refuses the call, ChatOpenAI
    raises, the graph raises; the episode is masked, the others play."""
    def over_budget(task):
        return run_episode(dataclasses.replace(task, max_steps=task.max_steps + 1) if task.traj_id == 0 else task)

    engine, client = engine_for(model_dir, over_budget, "rollout.on_env_failure=mask")
    result = run(engine, client)
    errors = {e.traj_id: e.env_error for e in result.episodes}
    assert "Error code: 400" in errors[0] and "made its 3 calls (its budget)" in errors[0]
    assert [errors[t] for t in (1, 2, 3)] == [None] * 3
    assert result.stats["episodes_masked"] == 1 and set(result.batch.traj_id.tolist()) == {1, 2, 3}


# ----- the tool path, with a backend that calls the tools like the expert --------------------------------

def tool_call(command: str) -> dict:
    if command == "inventory":
        return {"name": "inventory", "arguments": {}}
    get = re.fullmatch(r"get (\d+) (.+)", command)
    if get:
        return {"name": "get", "arguments": {"count": int(get.group(1)), "item": get.group(2)}}
    craft = re.fullmatch(r"craft (\d+) (.+?) using (.+)", command)
    return {"name": "craft", "arguments": {"count": int(craft.group(1)), "item": craft.group(2),
                                           "ingredients": craft.group(3)}}


class ScriptedToolCaller(GenerationBackend):
    """Not a model: answers each prompt with the expert's next command(s) as Qwen ``<tool_call>`` blocks.
    The commands done so far are the prompt's ``<tool_response>`` blocks; the first reply calls two tools
    when the plan starts with two ``get``s; ``malformed`` goals get one malformed block at their second
    reply (until the agent's reminder follows it)."""

    name = "scripted tool caller (test only)"

    def __init__(self, tokenizer, plans: dict[str, list[str]], malformed: tuple[str, ...] = ()):
        self.tokenizer, self.plans, self.malformed = tokenizer, plans, malformed

    def respond(self, text: str) -> str:
        goal = next(g for g in self.plans if g in text)
        plan, done = self.plans[goal], text.count("<tool_response>")
        if goal in self.malformed and done == 2 and REMINDER not in text.rsplit("<tool_response>", 1)[-1]:
            return '<tool_call>\n{"name": "get", "arguments": 1 sugar cane}\n</tool_call>'
        commands = plan[:2] if done == 0 and all(c.startswith("get ") for c in plan[:2]) else plan[done:done + 1]
        return "\n".join(f"<tool_call>\n{json.dumps(tool_call(c))}\n</tool_call>" for c in commands)

    def generate(self, prompt_ids, sampling):
        out = []
        for ids in prompt_ids:
            text = self.respond(self.tokenizer.decode(list(ids), skip_special_tokens=False))
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [sampling.stop_token_ids[0]]
            out.append(Generation(tokens, [0.0] * len(tokens), "stop"))
        return out

    def load_weights(self, state_dict):
        raise NotImplementedError


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streamed"])
def test_tool_calls_play_the_episode_through_the_graph(model_dir, streaming):
    env = make_env("textcraft", max_steps=10)
    plans = {}
    for task in TASKS:
        _, info = env.reset(task)
        plans[info["task"]] = env.expert_actions()
    first, second = plans      # 1: get, craft, craft, get, craft, craft; 2: get, get, get, craft, craft
    backend = ScriptedToolCaller(load_tokenizer(model_dir), plans, malformed=(second,))
    engine, client = engine_for(model_dir, functools.partial(run_episode, streaming=streaming),
                                "env.history_length=10", backend=backend, max_steps=10)
    result = run(engine, client)
    batch = result.batch
    assert all(e.env_error is None and e.won for e in result.episodes)
    assert [e.length for e in result.episodes] == [6, 6, 5, 5]
    assert [round(e.episode_return, 4) for e in result.episodes] == [10.0, 10.0, 9.9, 9.9]
    for traj in range(4):
        mine = rows(batch, traj)
        rewards = [round(float(batch.reward[i]), 4) for i in mine]
        valid = [bool(batch.action_valid[i]) for i in mine]
        assert bool(batch.done[mine[-1]]) and all(bool(batch.success[i]) for i in mine)
        if traj < 2:
            assert rewards == [0.0] * 5 + [10.0] and all(valid)
            assert batch.anchor_obs[mine[1]] == "Got 4 bamboo" and batch.anchor_obs[mine[2]] == "Crafted 1 minecraft:stick"
        else:       # two gets in the first reply; the second reply malformed (charged once, by the gateway)
            assert rewards == [0.0, -0.1, 0.0, 0.0, 10.0] and valid == [True, False, True, True, True]
            assert batch.anchor_obs[mine[1]] == batch.anchor_obs[mine[2]] == "Got 1 brown mushroom"
        assert batch.anchor_obs[mine[0]].startswith("Crafting commands:")
        for a, b in zip(mine, mine[1:]):      # the tool calls LangChain sends back are the sampled ids
            assert prompt(batch, b)[:len(prompt(batch, a)) + len(response(batch, a))] == \
                prompt(batch, a) + response(batch, a)
    text = engine.tokenizer.decode(prompt(batch, rows(batch, 2)[-1]))
    assert text.count("<tool_response>\nGot 1 ") == 3 and "<tool_response>\nCrafted 1 minecraft:sugar" in text
