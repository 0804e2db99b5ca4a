"""The gateway over HTTP with the real ``openai`` client: chat completions (plain and streamed), many agents
at once batched into engine calls, every call one recorded step (token in, token out), tools listed
in the prompt, and bad input refused in OpenAI's error shape, costing only its episode."""

from __future__ import annotations

import threading

import pytest

from agentrl.gateway.server import Gateway
from agentrl.generation import make_backend
from tiny_policy import save_tiny_policy

openai = pytest.importorskip("openai")



@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("gateway") / "tiny"
    tokenizer = save_tiny_policy(out, vocab_size=400)
    backend = make_backend("torch", str(out), max_model_len=1024)
    with Gateway(backend, tokenizer, max_model_len=1024, default_max_tokens=12, batch_wait_s=0.2) as gateway:
        yield gateway, tokenizer


def client(gateway, key):
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=60)


USER = [{"role": "system", "content": "Craft items."}, {"role": "user", "content": "Goal: craft stick."}]


def test_each_call_is_a_recorded_step_and_the_next_prompt_keeps_the_sampled_ids(served):
    gateway, tokenizer = served
    episode = gateway.open_episode("task-1")
    gateway.policy_version = 3
    agent = client(gateway, episode.key)
    assert [m.id for m in agent.models.list().data] == ["agentrl-policy"]
    first = agent.chat.completions.create(model="agentrl-policy", messages=USER, max_tokens=8, logprobs=True,
                                          extra_body={"agentrl": {"anchor": "stick-goal"}})
    choice = first.choices[0]
    assert choice.finish_reason in ("stop", "length") and first.usage.completion_tokens == len(choice.logprobs.content)
    conversation = USER + [{"role": "assistant", "content": choice.message.content},
                           {"role": "user", "content": "Inventory: []"}]
    agent.chat.completions.create(model="agentrl-policy", messages=conversation, max_tokens=8)
    steps = gateway.close_episode(episode.key).steps
    assert len(steps) == 2 and steps[0].policy_version == 3 and steps[0].anchor == "stick-goal"
    assert steps[0].prompt_ids == gateway.renderer.prompt(USER).ids
    assert [round(x.logprob, 5) for x in choice.logprobs.content] == [round(x, 5) for x in steps[0].logprobs]
    # the second prompt: the first prompt, the ids sampled for the reply, then the new user turn
    assert steps[1].prompt_ids[:len(steps[0].prompt_ids) + len(steps[0].response_ids)] == \
        steps[0].prompt_ids + steps[0].response_ids
    assert steps[1].tokenized == [True, True, False, True] and steps[1].anchor == "Inventory: []"
    with pytest.raises(openai.AuthenticationError, match="unknown or missing API key"):   # its key is gone
        agent.chat.completions.create(model="agentrl-policy", messages=USER)


def test_streamed_and_plain_replies_agree(served):
    gateway, _ = served
    episode = gateway.open_episode()
    agent = client(gateway, episode.key)
    plain = agent.chat.completions.create(model="m", messages=USER, temperature=0, max_tokens=10)
    chunks = list(agent.chat.completions.create(model="m", messages=USER, temperature=0, max_tokens=10, stream=True,
                                                stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert len(gateway.close_episode(episode.key).steps) == 2


def test_many_agents_at_once_share_engine_calls(served):
    gateway, _ = served
    episodes = [gateway.open_episode(f"agent-{i}") for i in range(6)]
    calls_before, requests_before = gateway.batcher.calls, gateway.batcher.requests
    barrier = threading.Barrier(len(episodes))
    errors = []

    def run(key):
        try:
            barrier.wait()
            client(gateway, key).chat.completions.create(model="m", messages=USER, max_tokens=6)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(e.key,)) for e in episodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert gateway.batcher.requests - requests_before == 6 and gateway.batcher.calls - calls_before < 6
    assert all(len(gateway.close_episode(e.key).steps) == 1 for e in episodes)


def test_tools_are_listed_in_the_prompt_and_tool_results_accepted(served):
    gateway, tokenizer = served
    episode = gateway.open_episode()
    tools = [{"type": "function", "function": {"name": "craft", "description": "craft an item",
                                               "parameters": {"type": "object", "properties": {"item": {"type": "string"}}}}}]
    messages = USER + [{"role": "assistant", "content": None, "tool_calls": [
                          {"id": "c1", "type": "function", "function": {"name": "craft", "arguments": '{"item": "stick"}'}}]},
                       {"role": "tool", "tool_call_id": "c1", "content": "Crafted 4 minecraft:stick"}]
    client(gateway, episode.key).chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=4)
    step = gateway.close_episode(episode.key).steps[0]
    prompt = tokenizer.decode(step.prompt_ids)
    assert "# Tools" in prompt and '"name": "craft"' in prompt and "<tool_response>\nCrafted 4" in prompt
    assert '<tool_call>\n{"name": "craft", "arguments": {"item": "stick"}}\n</tool_call>' in prompt
    assert step.anchor == "Crafted 4 minecraft:stick" and step.tokenized == [True, True, True, True]


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 2}, "n must be 1"),
    ({"top_logprobs": 3, "logprobs": True}, "top_logprobs above 0"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, r"messages\[0\] needs a role"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop must be"),
])
def test_a_malformed_request_is_refused_and_fails_only_its_episode(served, kwargs, message):
    gateway, _ = served
    bad, good = gateway.open_episode(), gateway.open_episode()
    request = {"model": "m", "messages": USER, **kwargs}
    with pytest.raises(openai.BadRequestError, match=message):
        client(gateway, bad.key).chat.completions.create(**request)
    client(gateway, good.key).chat.completions.create(model="m", messages=USER, max_tokens=2)
    assert gateway.close_episode(bad.key).failure and gateway.close_episode(good.key).failure is None


def test_unknown_keys_and_budgets(served):
    gateway, _ = served
    with pytest.raises(openai.AuthenticationError, match="unknown or missing API key"):
        client(gateway, "not-a-key").chat.completions.create(model="m", messages=USER)
    episode = gateway.open_episode(max_calls=1)
    agent = client(gateway, episode.key)
    agent.chat.completions.create(model="m", messages=USER, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="budget"):
        agent.chat.completions.create(model="m", messages=USER, max_tokens=2)
    tight = gateway.open_episode(max_tokens=5)
    with pytest.raises(openai.BadRequestError, match="no room left to generate"):
        client(gateway, tight.key).chat.completions.create(model="m", messages=USER)
    assert "budget_exceeded" in gateway.close_episode(episode.key).failure
    assert "budget_exceeded" in gateway.close_episode(tight.key).failure


class PerRequestBackend:
    """A backend that samples per request (as vLLM does): it records each call's settings."""

    per_request_sampling = True

    def __init__(self):
        self.calls = []

    def generate_each(self, prompt_ids, samplings):
        from agentrl.generation.base import Generation

        self.calls.append(list(samplings))
        return [Generation([7] * s.max_tokens, [-0.5] * s.max_tokens, "length") for s in samplings]


def test_a_per_request_backend_gets_differing_requests_in_one_call_with_their_own_seeds():
    from agentrl.gateway.episodes import Batcher
    from agentrl.generation.base import SamplingParams

    backend = PerRequestBackend()
    batcher = Batcher(backend, wait_s=0.5, seed=100)
    batcher.expected = lambda: 3            # the three agents of the wave: sent once all three wait
    try:
        futures = [batcher.submit([1, 2], SamplingParams(max_tokens=2, seed=5), True),
                   batcher.submit([1, 2], SamplingParams(max_tokens=3)),
                   batcher.submit([3], SamplingParams(max_tokens=1, temperature=0.5))]
        results = [f.result(timeout=10) for f in futures]
    finally:
        batcher.close()
    assert len(backend.calls) == 1 and batcher.calls == 1 and batcher.requests == 3
    assert [s.seed for s in backend.calls[0]] == [5, 100, 101]        # a named seed as given, the others in order
    assert [len(g.token_ids) for g, _ in results] == [2, 3, 1]


def test_a_failing_engine_call_is_a_server_error_and_kept(served):
    gateway, _ = served
    backend, calls = gateway.batcher.backend, gateway.batcher.calls

    class Broken:
        def generate(self, prompts, sampling):
            raise RuntimeError("engine down")

    gateway.batcher.backend = Broken()
    episode = gateway.open_episode()
    try:
        with pytest.raises(openai.InternalServerError, match="the generation engine failed: RuntimeError: engine down"):
            client(gateway, episode.key).chat.completions.create(model="m", messages=USER, max_tokens=2)
    finally:
        gateway.batcher.backend = backend
    assert isinstance(gateway.batcher.error, RuntimeError) and gateway.batcher.calls == calls
    assert "engine_error" in gateway.close_episode(episode.key).failure
    gateway.batcher.error = None


def test_episode_clients_share_one_connection_pool_and_keep_their_own_keys(served):
    from agentrl.envs.base import TaskRef
    from agentrl.rollout.agents.task import AgentTask

    gateway, _ = served
    episodes = [gateway.open_episode(f"pool-{i}") for i in range(2)]
    tasks = [AgentTask(TaskRef("train", 0), gateway.base_url, e.key, gateway.model_name, None, 3) for e in episodes]
    clients = [t.openai_client(timeout=30) for t in tasks]
    assert clients[0]._client is clients[1]._client and clients[0].max_retries == 0      # one pool, no retries
    for agent in clients + clients[:1]:
        agent.chat.completions.create(model="agentrl-policy", messages=USER, max_tokens=4)
    assert [len(gateway.close_episode(e.key).steps) for e in episodes] == [2, 1]


def test_a_developer_message_is_rendered_as_the_system_message(served):
    gateway, _ = served
    episode = gateway.open_episode("developer")
    developer = [{"role": "developer", "content": "Craft items."}, USER[1]]
    client(gateway, episode.key).chat.completions.create(model="agentrl-policy", messages=developer, max_tokens=4)
    step = gateway.close_episode(episode.key).steps[0]
    assert step.prompt_ids == gateway.renderer.prompt(USER).ids and step.messages[0]["role"] == "system"


def test_left_truncation_keeps_the_system_message_and_the_last_tokens(served):
    gateway, tokenizer = served
    long_user = [{"role": "system", "content": "Craft items. Tools: get, craft."},
                 {"role": "user", "content": "Inventory: [oak planks] (4). " * 60 + "Goal: craft stick."}]
    whole = gateway.renderer.prompt(long_user)
    assert 0 < whole.system_len < 60 < len(whole.ids)
    with Gateway(gateway.batcher.backend, tokenizer, max_model_len=1024, default_max_tokens=4, max_prompt_tokens=120,
                 prompt_truncation="left") as short:
        for messages, kept in ((long_user, whole.system_len), (long_user[1:], 0)):   # without a system message:
            episode = short.open_episode("long")                                      # the last tokens only
            client(short, episode.key).chat.completions.create(model="m", messages=messages, max_tokens=4)
            ids = short.close_episode(episode.key).steps[0].prompt_ids
            full = short.renderer.prompt(messages).ids
            assert len(ids) == 120 and ids[:kept] == full[:kept] and ids[kept:] == full[-(120 - kept):]
        assert short.truncated_prompts == 2
