"""Outside agents through the gateway as the rollout engine (rollout.agent): an openai-client TextCraft
agent gives one StepBatch row per model call, with its anchors, rewards and log-probs; an agent
that raises, hangs, returns no reward, makes no call or breaks its budget costs its episode only
(re-run or masked as for environment failures)."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

from agentrl.config import load_config
from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.rollout.agents.task import load_agent
from agentrl.rollout.agents.engine import AgentEngine
from agentrl.generation import make_backend
from tiny_policy import save_tiny_policy

pytest.importorskip("openai")
TASKS = [TaskRef("train", 1), TaskRef("train", 2)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("agents") / "tiny"
    save_tiny_policy(out)
    return str(out)


def engine_for(model_dir, agent, *overrides):
    from agentrl.models import load_tokenizer

    cfg = load_config("textcraft_grpo_tiny", ["env.max_steps=3", "rollout.max_response_tokens=8",
                                              "rollout.max_prompt_tokens=3000", *overrides])
    client = EnvClient.local("textcraft", 4, {"max_steps": 3})
    backend = make_backend("torch", model_dir, max_model_len=3008)
    engine = AgentEngine(backend, load_tokenizer(model_dir), client, cfg.rollout, cfg.env, agent=agent)
    return engine, client


def play(model_dir, agent, *overrides):
    """Both tasks, two episodes each, with ``agent`` (the engine and its env closed after)."""
    engine, client = engine_for(model_dir, agent, *overrides)
    try:
        return engine.run(TASKS, group_size=2, seed=1)
    finally:
        engine.close()
        client.close()


def test_an_openai_agent_gives_one_row_per_model_call(model_dir):
    result = play(model_dir, load_agent("agentrl.agents.textcraft_openai:run_episode"))
    batch = result.batch
    assert len(result.episodes) == 4 and all(e.env_error is None for e in result.episodes)
    assert sorted(set(batch.traj_id.tolist())) == [0, 1, 2, 3] and sorted(set(batch.group_id.tolist())) == [0, 1]
    assert len(batch) == sum(e.length for e in result.episodes) == result.stats["env_steps"]
    first = [i for i in range(len(batch)) if batch.step[i] == 0]
    assert all(batch.anchor_obs[i].startswith("Crafting commands:") for i in first)    # the agent's anchor
    assert bool(batch.done[[i for i in range(len(batch)) if batch.traj_id[i] == 0][-1]])
    assert float(batch.rollout_logprobs.abs().sum()) > 0 and batch.anchor_key is not None


def flaky_and_broken(task):
    """Episode 0 raises on its first attempt only; 1 returns no reward; 2 makes no call; 3 plays."""
    import openai

    if task.traj_id == 0 and not getattr(flaky_and_broken, "raised", False):
        flaky_and_broken.raised = True
        raise RuntimeError("agent bug")
    if task.traj_id == 2:
        return 1.0
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": "hi"}])
    return None if task.traj_id == 1 else {"reward": 1.0}


def test_a_failing_agent_costs_its_episode_which_is_re_run_or_masked(model_dir):
    masked = play(model_dir, flaky_and_broken, "rollout.on_env_failure=mask")
    errors = {e.traj_id: e.env_error for e in masked.episodes}
    assert "RuntimeError: agent bug" in errors[0] and "not a reward" in errors[1]
    assert "made no model call" in errors[2] and errors[3] is None
    assert masked.stats["episodes_masked"] == 3 and set(masked.batch.traj_id.tolist()) == {3}

    flaky_and_broken.raised = False          # episode 0 raises once, episode 1 plays (as episode 3 did)
    engine, client = engine_for(model_dir, lambda task: flaky_and_broken(task if task.traj_id == 0 else
                                                                         dataclasses.replace(task, traj_id=3)),
                                "rollout.on_env_failure=rerun", "rollout.max_env_failures=8")
    try:
        engine.instance_ids = engine.instance_ids[:2]      # one group per wave
        rerun = engine.run(TASKS[:1], group_size=2, seed=1, traj_id_start=0)
    finally:
        engine.close()
        client.close()
    assert rerun.stats["episodes_rerun"] == 1 and {e.env_error for e in rerun.episodes} == {None}


def test_a_hung_agent_or_one_over_budget_fails_within_the_timeout(model_dir):
    def hangs_or_loops(task):
        import openai

        if task.traj_id == 0:
            time.sleep(30)
        client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
        calls = task.max_steps + 1 if task.traj_id == 1 else task.max_steps    # 1: one call more than it may make
        for _ in range(calls):
            client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": "hi"}])
        return 1.0

    started = time.monotonic()
    result = play(model_dir, hangs_or_loops, "rollout.on_env_failure=mask", "rollout.agent_timeout_s=6")
    assert time.monotonic() - started < 20
    errors = {e.traj_id: e.env_error for e in result.episodes}
    assert "did not finish within rollout.agent_timeout_s=6" in errors[0]
    assert "budget" in errors[1] and errors[2] is None and errors[3] is None
    assert set(result.batch.traj_id.tolist()) == {2, 3} and len(result.batch) == 6


def test_an_engine_failure_fails_the_rollout_not_the_agents(model_dir):
    engine, client = engine_for(model_dir, load_agent("agentrl.agents.textcraft_openai:run_episode"),
                                "rollout.on_env_failure=rerun")

    def broken(prompts, sampling):
        raise RuntimeError("engine down")

    engine.backend.generate = broken
    try:
        with pytest.raises(RuntimeError, match="engine failed during the agents' wave: RuntimeError: engine down"):
            engine.run(TASKS[:1], group_size=2, seed=1)
    finally:
        engine.close()
        client.close()


def test_the_agents_step_valid_sets_action_valid_and_the_invalid_count(model_dir):
    from agentrl.rollout.agents.task import AgentError, outcome_of

    def judged(task):
        client = task.openai_client()
        for _ in range(2):
            client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": "hi"}])
        return {"reward": 0.0, "step_valid": [task.traj_id % 2 == 0, True]}

    result = play(model_dir, judged)
    batch = result.batch
    invalid = {(int(batch.traj_id[i]), int(batch.step[i])) for i in range(len(batch)) if not batch.action_valid[i]}
    assert invalid == {(1, 0), (3, 0)}
    assert [e.invalid_actions for e in result.episodes] == [0, 1, 0, 1]
    with pytest.raises(AgentError, match="step_valid must be 2 booleans"):
        outcome_of({"reward": 1.0, "step_valid": [True]}, 2)


def test_agents_in_processes_fail_alone_and_step_their_env_through_the_gateway(model_dir):
    engine, client = engine_for(model_dir, "process_agents:steps_then_misbehaves", "rollout.agent_processes=2",
                                "rollout.on_env_failure=mask", "rollout.agent_timeout_s=120")
    try:
        result = engine.run(TASKS, group_size=2, seed=1)
        pids = {p.pid for p in engine.processes._processes}
    finally:
        engine.close()
        client.close()
    errors = {e.traj_id: e.env_error for e in result.episodes}
    assert "ValueError: agent bug in a process" in errors[0]
    # episodes 1 and 3 share the second process (round-robin): its death fails both, the first plays on
    assert "the agent process died (exit code 3)" in errors[1] and "process died" in errors[3]
    assert errors[2] is None and set(result.batch.traj_id.tolist()) == {2}
    assert float(result.batch.reward.sum()) == 1.0        # its env step went through the gateway to this process's env
    assert os.getpid() not in pids and len(pids) == 2      # played elsewhere; the dead process was replaced


class RecordingClient:
    """The run's env client, recording every step that reaches an instance (instance id, action)."""

    def __init__(self, client):
        self.client, self.steps = client, []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def step(self, items, *args, **kwargs):
        self.steps += [(i, action) for i, action in items]
        return self.client.step(items, *args, **kwargs)


@pytest.mark.parametrize("processes", [0, 1])
def test_a_timed_out_agent_cannot_step_its_environment_afterwards(model_dir, tmp_path, monkeypatch, processes):
    """Episode 0 times out, is re-run on the same instance, and its first attempt wakes up and steps:
    that late step is refused in threads and in processes alike, and never reaches the instance."""
    from agentrl.models import load_tokenizer

    late_file = tmp_path / "late.txt"
    monkeypatch.setenv("AGENTRL_TEST_LATE_FILE", str(late_file))
    monkeypatch.setenv("AGENTRL_TEST_LATE_S", "3")
    cfg = load_config("textcraft_grpo_tiny", ["env.max_steps=3", "rollout.max_response_tokens=8",
                                              "rollout.max_prompt_tokens=3000", "rollout.agent_timeout_s=1.5",
                                              f"rollout.agent_processes={processes}", "rollout.on_env_failure=rerun"])
    client = RecordingClient(EnvClient.local("textcraft", 4, {"max_steps": 3}))
    backend = make_backend("torch", model_dir, max_model_len=3008)
    agent = "process_agents:late_stepper" if processes else load_agent("process_agents:late_stepper")
    engine = AgentEngine(backend, load_tokenizer(model_dir), client, cfg.rollout, cfg.env, agent=agent)
    try:
        result = engine.run(TASKS[:1], group_size=2, seed=1)
        deadline = time.monotonic() + 10
        while "\n" not in late_file.read_text().partition("\n")[2] and time.monotonic() < deadline:
            time.sleep(0.1)      # the first attempt wakes up (3 s) and tries its late step
    finally:
        engine.close()
        client.close()
    assert result.stats["episodes_rerun"] >= 1 and all(e.env_error is None for e in result.episodes)
    outcome = late_file.read_text().splitlines()[-1]
    assert outcome.startswith("refused"), outcome
    assert ("get 5 spruce logs" not in [action for _, action in client.steps])     # it never reached an instance


def test_too_many_agent_failures_stop_with_advice_about_the_agent(model_dir):
    from agentrl.rollout.engine import EnvFailureLimitError

    def broken(task):
        raise ValueError("agent bug")

    engine, client = engine_for(model_dir, broken, "rollout.max_env_failures=1", "rollout.on_env_failure=rerun")
    try:
        with pytest.raises(EnvFailureLimitError) as stopped:
            engine.run(TASKS[:1], group_size=2, seed=1)
    finally:
        engine.close()
        client.close()
    message = str(stopped.value)
    assert "ValueError: agent bug" in message and "the agent (rollout.agent=broken) failed: fix it" in message
    assert "rollout.agent_timeout_s" in message and "env servers" not in message
    assert stopped.value.resume_when == "the agent is fixed"


def test_prompts_the_gateway_cuts_are_counted_in_the_rollout_stats_and_warned_about_once(model_dir, capsys):
    from agentrl.training.metrics import PromptCutWarning, episode_metrics

    result = play(model_dir, load_agent("agentrl.agents.textcraft_openai:run_episode"),
                  "rollout.max_prompt_tokens=64", "rollout.prompt_truncation=left")
    assert result.stats["truncated_prompts"] == result.stats["env_steps"] > 0      # before: 0
    metrics = episode_metrics(result)
    assert metrics["rollout/truncated_prompts"] > 0 and "rollout/dropped_system_messages" in metrics
    capsys.readouterr()
    warning = PromptCutWarning()
    for iteration in (1, 2):
        warning.check(metrics, iteration, 64)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrl: warning:") and "rollout.max_prompt_tokens=64" in lines[0]
