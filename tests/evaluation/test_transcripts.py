"""The rollout engine's opt-in transcripts and the environment's task score, with a scripted
expert backend (no model): off by default, complete when asked for."""

import sys
from pathlib import Path

import pytest

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.evaluation.episodes import episode_record
from agentrl.evaluation.runner import with_transcripts
from agentrl.models import load_tokenizer
from agentrl.rollout.engine import RolloutEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from rollout_helpers import env_config, rollout_config  # noqa: E402
from scripted_backend import ScriptedExpertBackend, expert_plans  # noqa: E402


@pytest.mark.parametrize("env_name, task", [("textcraft", TaskRef("depth2", 1)), ("webshop", TaskRef("test", 0))])
def test_transcripts_only_when_asked_and_the_task_score(env_name, task, tiny_policy):
    tokenizer = load_tokenizer(tiny_policy)
    env_cfg = env_config(env_name, max_steps=15)
    plans = expert_plans(env_name, [task])
    results = {}
    for record in (False, True):
        client = EnvClient.local(env_name, 1, {"max_steps": env_cfg.max_steps})
        engine = RolloutEngine(ScriptedExpertBackend(tokenizer, plans), tokenizer, client,
                               with_transcripts(rollout_config(max_prompt_tokens=8000), record), env_cfg)
        results[record] = engine.run([task], group_size=1).episodes[0]
        client.close()
    plain, recorded = results[False], results[True]
    assert plain.transcript is None and plain.won and recorded.won
    plan = next(iter(plans.values()))
    steps = recorded.transcript
    assert len(steps) == recorded.length + 1 == len(plan) + 1
    assert [s["action"] for s in steps[:-1]] == plan and all(s["valid"] for s in steps[:-1])
    assert "<action>" in steps[0]["response"] and set(steps[-1]) == {"observation"}
    assert sum(s["reward"] for s in steps[:-1]) == pytest.approx(recorded.episode_return)
    line = episode_record(recorded, seed=3)
    assert line["seed"] == 3 and line["success"] and line["transcript"] == steps
    if env_name == "webshop":  # the purchase score, reported by the env at the last step
        assert plain.score == recorded.score == 1.0 and line["score"] == 1.0
    else:
        assert plain.score is None and line["score"] == 1.0
