"""`agentrl eval` on a tiny policy through the CLI (Ray rollout workers), then resumed."""

import json

import pytest

from agentrl.evaluation.episodes import EpisodeLog, summarize_records
from eval_cli import RECIPE, TINY, run_cli

pytestmark = pytest.mark.slow

EVAL_ARGS = ["split=depth2", "seeds=0,1", "eval.num_tasks=3", "eval.chunk_size=2", "env.max_steps=3",
             "rollout.max_response_tokens=8", *TINY]


def test_eval_writes_episodes_and_summary_then_resumes(tmp_path, tiny_policy, ray_head):
    """The rollout workers of `agentrl eval` live on the session's Ray head."""
    out = tmp_path / "eval"
    proc = run_cli(["eval", f"checkpoint={tiny_policy}", "env=textcraft", f"recipe={RECIPE}", f"out={out}",
                    *EVAL_ARGS], extra_env=ray_head)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = (out / "episodes.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert sorted((r["seed"], r["task"]["index"]) for r in records) == [(s, i) for s in (0, 1) for i in range(3)]
    first = records[0]
    assert first["type"] == "depth2" and first["task"]["split"] == "depth2"
    assert set(first) >= {"success", "reward", "score", "steps", "transcript"}
    steps = first["transcript"]
    assert len(steps) == first["steps"] + 1  # every step, then the observation the episode ended on
    assert steps[0]["observation"].startswith("Crafting commands") and "action" in steps[0]
    assert set(steps[-1]) == {"observation"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["episodes"] == 6 and summary["tasks"] == 3
    assert set(summary["per_seed"]) == {"0", "1"} and "depth2" in summary["by_type"]
    assert summary["success_rate"] == sum(r["success"] for r in records) / 6
    assert "over_seeds" in summary
    # the per-task-type bar chart beside the summary
    assert (out / "success_by_type.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # drop two episodes and leave a torn line, as a kill in the middle of a write would
    kept = lines[:4]
    (out / "episodes.jsonl").write_text("\n".join(kept) + "\n" + lines[4][: len(lines[4]) // 2])
    again = run_cli(["eval", f"checkpoint={tiny_policy}", "env=textcraft", f"recipe={RECIPE}", f"out={out}",
                     *EVAL_ARGS], extra_env=ray_head)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "4 episode(s) already in" in again.stdout and "2 to play" in again.stdout
    resumed = (out / "episodes.jsonl").read_text().splitlines()
    assert resumed[:4] == kept and len(resumed) == 6  # the done ones untouched, only the missing two played
    assert all(json.loads(line) for line in resumed)
    assert json.loads((out / "summary.json").read_text())["episodes"] == 6

    # a third run has nothing left to play and starts no rollout workers
    third = run_cli(["eval", f"checkpoint={tiny_policy}", "env=textcraft", f"recipe={RECIPE}", f"out={out}",
                     *EVAL_ARGS], extra_env=ray_head)
    assert third.returncode == 0 and "0 to play" in third.stdout and "chunk" not in third.stdout


def test_episode_log_drops_a_torn_tail_and_appends_cleanly(tmp_path):
    log = EpisodeLog(tmp_path / "e.jsonl")
    rec = {"seed": 0, "task": {"split": "s", "index": 0}, "type": "a", "success": True, "reward": 1.0,
           "score": 1.0, "steps": 2}
    log.append([rec, {**rec, "task": {"split": "s", "index": 1}, "success": False, "score": 0.25}])
    with open(log.path, "a") as f:
        f.write('{"seed": 0, "task": {"spl')
    assert len(log.load()) == 2
    assert log.path.read_text().endswith("}\n")  # the torn tail is gone from the file
    log.append([{**rec, "seed": 1}])
    records = log.load()
    assert [r["seed"] for r in records] == [0, 0, 1]
    summary = summarize_records(records, env="textcraft", split="s", seeds=[0, 1], expected_tasks=2)
    assert not summary["complete"] and summary["episodes"] == 3
    assert summary["per_seed"]["0"]["mean_score"] == pytest.approx(0.625)
    assert summary["success_rate"] == pytest.approx(2 / 3)


def test_eval_needs_a_checkpoint_and_a_known_split(tmp_path, tiny_policy):
    proc = run_cli(["eval", "env=textcraft"])
    assert proc.returncode == 2 and "checkpoint=PATH" in proc.stdout
    proc = run_cli(["eval", f"checkpoint={tiny_policy}", f"recipe={RECIPE}", "split=nosuch", f"out={tmp_path}"])
    assert proc.returncode == 2 and "not a split of textcraft" in proc.stdout and "Traceback" not in proc.stdout
