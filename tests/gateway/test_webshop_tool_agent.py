"""The tool-calling WebShop agent (agentrl.agents.webshop_tools): its ``search``/``click`` tool calls reach the
environment as ``search[...]``/``click[...]`` actions through the real gateway, one multi-turn
conversation per episode whose later prompts keep the ids sampled for earlier replies (tool calls
included), replies without a usable tool call charged once; and `agentrl train` with it through the
CLI (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentrl.agents import webshop_tools
from agentrl.config import load_config
from agentrl.envs import TaskRef, make_env
from agentrl.envs.server import EnvClient
from agentrl.rollout.agents.task import load_agent
from agentrl.rollout.agents.engine import AgentEngine
from agentrl.models import build_tiny_model, load_tokenizer, train_tokenizer
from agentrl.generation import make_backend
from agentrl.generation.base import Generation, GenerationBackend
from agentrl.runs.tracking import read_metrics
from agentrl.warmstart.demonstrations import corpus_texts
from cli_train import TINY, run_cli
from tiny_policy import TINY as TINY_MODEL

pytest.importorskip("openai")
TASK = TaskRef("train", 0)
PENALTY = 0.5


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A BPE trained on WebShop expert text and a random tiny model."""
    tokenizer = train_tokenizer(corpus_texts("webshop", {}, "train", 30, history_length=2, think=False,
                                             style="compact"), vocab_size=600)
    out = tmp_path_factory.mktemp("webshop-agent") / "tiny"
    build_tiny_model(TINY_MODEL, tokenizer, seed=0).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)


def call(name: str, **arguments) -> str:
    # spaced unlike json.dumps: the gateway re-serialises the call, the agent sends that back
    return "<tool_call>\n{\"name\":\"%s\",  \"arguments\": %s}\n</tool_call>" % (name, json.dumps(arguments, indent=1))


class ScriptedReplies(GenerationBackend):
    """Not a model: answers the n-th call with ``replies[n]``, sampled one character per token (ids that
    re-tokenizing the text never gives back), then the stop token."""

    name = "scripted replies (test only)"

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.sampled = tokenizer, list(replies), []

    def generate(self, prompt_ids, sampling):
        out = []
        for _ in prompt_ids:
            text = self.replies[len(self.sampled)]
            ids = [self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(c)[0]) for c in text]
            ids = ids[:sampling.max_tokens - 1] + [sampling.stop_token_ids[0]]
            self.sampled.append(ids)
            out.append(Generation(ids, [-0.5] * len(ids), "stop"))
        return out

    def load_weights(self, state_dict):
        raise NotImplementedError


class RecordedEnv:
    """The agent's env session, with the actions it was sent."""

    def __init__(self, env, actions):
        self.env, self.actions = env, actions

    def reset(self):
        return self.env.reset()

    def step(self, action):
        self.actions.append(action)
        return self.env.step(action)


def play(policy_dir, backend_for, overrides=(), tasks=(TASK,), group_size=1):
    cfg = load_config("webshop_grpo_tiny", ["env.max_steps=8", "rollout.max_prompt_tokens=4000",
                                            "rollout.max_response_tokens=300", *overrides])
    actions: dict[int, list[str]] = {}

    run_episode = load_agent("agentrl.agents.webshop_tools:run_episode")

    def agent(task):
        recorded = RecordedEnv(task.env, actions.setdefault(task.traj_id, []))
        return run_episode(dataclasses.replace(task, env=recorded))

    tokenizer = load_tokenizer(policy_dir)
    backend = backend_for(tokenizer)
    client = EnvClient.local("webshop", 2, {"max_steps": 8})
    engine = AgentEngine(backend, tokenizer, client, cfg.rollout, cfg.env, agent=agent)
    try:
        result = engine.run(list(tasks), group_size=group_size, seed=0)
    finally:
        engine.close()
        client.close()
    return result, actions, tokenizer, backend


def contains(ids, part):
    return any(ids[i:i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_tool_calls_reach_webshop_as_actions_in_one_conversation_that_keeps_the_sampled_ids(policy_dir):
    env = make_env("webshop")
    _, info = env.reset(TASK)
    query, product, option, buy = [a[a.index("[") + 1:-1] for a in env.expert_actions()]
    assert buy == "buy now"
    replies = ["I am not sure.",                                              # no tool call: charged by the agent
               '<tool_call>\n{"name": "search", "arguments": {"query": </tool_call>',   # malformed: by the gateway
               "Let me search.\n" + call("search", query=query),
               call("click", item=product),
               call("buy", item="it"),                                        # no such tool: charged by the agent
               call("click", item=option) + "\n" + call("click", item="buy now"),   # the second is not run
               call("click", item="buy now")]
    result, actions, tokenizer, backend = play(
        policy_dir, lambda tok: ScriptedReplies(tok, replies),
        [f"rollout.invalid_action_penalty={PENALTY}", "env.history_length=2"])
    assert actions[0] == [webshop_tools.NO_ACTION, webshop_tools.NO_ACTION, f"search[{query}]", f"click[{product}]",
                          webshop_tools.NO_ACTION, f"click[{option}]", "click[buy now]"]
    episode, batch = result.episodes[0], result.batch
    assert episode.env_error is None and episode.won and len(batch) == 7
    # invalid: the plain reply and the unknown tool (the agent says so: step_valid), the malformed block (the gateway)
    assert batch.action_valid.tolist() == [False, False, True, True, False, True, True]
    rewards = (batch.env_reward - batch.invalid_penalty).tolist()
    assert rewards == pytest.approx([-PENALTY, -PENALTY, 0, 0, -PENALTY, 0, 10.0])           # each charged once
    assert batch.done.tolist() == [False] * 6 + [True] and bool(batch.success.all())
    # the anchors: the page each decision was made on (the search page until the search, then the results ...)
    assert batch.anchor_obs[0] == batch.anchor_obs[2] and batch.anchor_obs[0].startswith("WebShop [SEP] Instruction:")
    assert "Page 1 (Total results:" in batch.anchor_obs[3] and "Buy Now" in batch.anchor_obs[6]

    prompts = [batch.prompt_ids[i, :int(batch.prompt_lengths[i])].tolist() for i in range(len(batch))]
    responses = [batch.response_ids[i][batch.response_mask[i] > 0].tolist() for i in range(len(batch))]
    assert responses == backend.sampled
    texts = [tokenizer.decode(p) for p in prompts]
    assert all(t.startswith("<|im_start|>system\n" + webshop_tools.SYSTEM + "\n\n# Tools") for t in texts)
    assert all('"name": "search"' in t and '"name": "click"' in t for t in texts)
    # every later prompt holds the previous reply as sampled (one id per character), though
    # tokenizing its text (or the re-serialised tool call) gives other ids
    for k in range(1, 7):
        assert contains(prompts[k], responses[k - 1]), k
        assert not contains(tokenizer(texts[k])["input_ids"], responses[k - 1]), k
    # and the replies within the window (the last env.history_length = 2 turns), no older ones
    assert contains(prompts[6], responses[4]) and not contains(prompts[6], responses[3])
    assert "<tool_response>\nNot run: one action per turn.\n</tool_response>" in texts[6]
    assert "Error: no tool 'buy'" in texts[5] and texts[1].count(webshop_tools.NUDGE.strip()) == 1


def test_a_random_tiny_policy_plays_whole_episodes_through_the_gateway(policy_dir):
    result, actions, _, _ = play(policy_dir, lambda tok: make_backend("torch", policy_dir, max_model_len=4100),
                                 ["rollout.max_response_tokens=16", "env.max_steps=3",
                                  "rollout.invalid_action_penalty=0.1"],
                                 tasks=(TaskRef("train", 1), TaskRef("train", 2)), group_size=2)
    batch = result.batch
    assert len(result.episodes) == 4 and all(e.env_error is None for e in result.episodes)
    assert len(batch) == 12 == sum(len(a) for a in actions.values())     # every call one env step
    assert sorted(set(batch.group_id.tolist())) == [0, 1] and float(batch.rollout_logprobs.abs().sum()) > 0
    assert all(batch.anchor_obs[i].startswith("WebShop [SEP]") for i in range(len(batch)) if batch.step[i] == 0)
    # a random policy calls no tool: every step is a no-op, charged the penalty once
    assert (batch.env_reward - batch.invalid_penalty).tolist() == pytest.approx([-0.1] * 12)


@pytest.mark.slow
def test_train_webshop_with_the_tool_agent(tmp_path, ray_head):
    args = ["train", "recipe=webshop_grpo_tiny", *TINY, f"trainer.output_dir={tmp_path}", "trainer.run_name=tools",
            "trainer.sft.enabled=false", "trainer.iterations=2", "trainer.save_every=0", "trainer.eval_every=0",
            "trainer.eval_before_train=false", "trainer.final_checkpoint=false",
            "env.tasks_per_iteration=2", "env.group_size=2", "env.max_steps=3", "rollout.max_response_tokens=96",
            "rollout.max_prompt_tokens=3000", "rollout.agent=agentrl.agents.webshop_tools:run_episode",
            "rollout.invalid_action_penalty=0.1", "learner.num_ranks=1", "learner.mini_batch_size=12",
            "learner.micro_batch_size=4", "learner.skip_zero_advantage=false", "learner.entropy_coef=0.01",
            "logging.wandb.mode=disabled"]
    proc = run_cli(args, extra_env=ray_head)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-3000:]
    rows = [r for r in read_metrics(tmp_path / "tools" / "metrics.jsonl") if "learner/loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/env_steps"] == 12 and r["rollout/env_failures"] == 0 for r in rows)
