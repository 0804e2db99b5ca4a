"""`agentrl eval ... rollout.agent=module:function`: the evaluation episodes are played by an outside agent
(the openai-client TextCraft agent) through each rollout worker's gateway, logged like agentrl's own
loop's (a transcript per model call: observation, reply, the action sent to the environment), with
the agent named in the summary. The recipe's rollout.expert_guidance=true, which training refuses
beside an agent, does not stop an evaluation (it uses no expert)."""

import json

import pytest

from eval_cli import RECIPE, TINY, run_cli

pytest.importorskip("openai")
pytestmark = pytest.mark.slow

AGENT = "agentrl.agents.textcraft_openai:run_episode"


def test_eval_with_an_outside_agent(tmp_path, tiny_policy, ray_head):
    out = tmp_path / "eval"
    proc = run_cli(["eval", f"checkpoint={tiny_policy}", "env=textcraft", f"recipe={RECIPE}", f"out={out}",
                    "split=depth2", "seeds=0", "eval.num_tasks=2", "eval.chunk_size=2", "env.max_steps=3",
                    "rollout.max_response_tokens=8", f"rollout.agent={AGENT}", *TINY], extra_env=ray_head)
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert sorted((r["seed"], r["task"]["index"]) for r in records) == [(0, 0), (0, 1)]
    for record in records:
        assert record["env_error"] is None and record["type"] == "depth2" and 1 <= record["steps"] <= 3
        assert record["score"] == float(record["success"])
        calls, last = record["transcript"][:-1], record["transcript"][-1]
        assert len(calls) == record["steps"] and set(last) == {"observation"}      # then where the episode ended
        assert calls[0]["observation"].startswith("Crafting commands")           # the agent's anchor: the env's obs
        assert all({"observation", "response", "action", "valid", "reward"} <= set(c) for c in calls)
        assert record["reward"] == pytest.approx(sum(c["reward"] for c in calls))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["episodes"] == 2 and summary["agent"] == AGENT
