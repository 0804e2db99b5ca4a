"""`agentrl train` with trainer.mode one_step_off and async through the real CLI (Ray rollout
workers, env pool actors, DeepSpeed): two learner ranks in async mode; a resumed async run trains
on the groups its checkpoint buffered, with the learner's step count continued; a one_step_off run
killed after its first checkpoint and resumed reproduces the uninterrupted run's losses."""

import json
import math
import shutil
from pathlib import Path

import pytest

from agentrl.runs.tracking import read_metrics
from test_train_cli import kill_after_first_checkpoint, run_cli, start_model, train_args  # noqa: F401 - start_model is a fixture

pytestmark = pytest.mark.slow


def by_iteration(run_dir: Path, key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run_dir / "metrics.jsonl") if key in r}


def finish(proc, timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def test_async_two_learner_ranks_and_a_resume_from_the_buffered_groups(tmp_path, start_model):
    args = train_args(tmp_path / "full", start_model) + ["trainer.mode=async", "learner.rollout_is_cap=2"]
    out = finish(run_cli(args))
    run_dir = tmp_path / "full" / "run"
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "learner/loss" in r]
    assert [r["step"] for r in records] == [1, 2] and all(math.isfinite(r["learner/loss"]) for r in records)
    for r in records:
        assert 0 <= r["async/staleness_max"] <= 2 and r["async/versions_per_episode_max"] >= 1
        for key in ("async/groups_dropped", "async/buffer_groups", "time/learner_wait_s", "time/rollout_wait_s",
                    "learner/rollout_is_weight"):
            assert key in r, key
    assert "iter 2/2" in out and (run_dir / "final_model" / "model.safetensors").is_file()
    # checkpoint 1 was written once iteration 2's rollout call had arrived: it holds its two groups
    saved = run_dir / "checkpoints" / "iter_000001" / "rollout_buffer"
    assert json.loads((saved / "stream.json").read_text())["in_flight"] == []
    assert len(list(saved.glob("group_*"))) == 2

    # the same run as if killed right after checkpoint 1: resumed, it trains iteration 2 on the
    # buffered groups, from the same learner state and step count, so the loss is the same
    resumed_dir = tmp_path / "resumed" / "run"
    shutil.copytree(run_dir, resumed_dir, ignore=shutil.ignore_patterns("iter_000002", "final_model", "wandb"))
    (resumed_dir / "checkpoints" / "latest").write_text("iter_000001")
    kept = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if json.loads(line).get("step", 0) <= 1]
    (resumed_dir / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    out = finish(run_cli(train_args(tmp_path / "resumed", start_model) + ["trainer.mode=async", "learner.rollout_is_cap=2"]))
    assert "resumed run after iteration 1" in out and "restored 2 buffered groups; 0 rollout calls" in out
    for key in ("learner/loss", "learner/pg_loss", "learner/optimizer_steps_total"):
        assert by_iteration(resumed_dir, key)[2] == pytest.approx(by_iteration(run_dir, key)[2], rel=1e-5, abs=1e-7), key


def test_one_step_off_killed_and_resumed_matches_the_uninterrupted_run(tmp_path, start_model):
    # one_step_off: every rollout call runs on one policy version, so two executions give the same
    # samples and the resumed run must reproduce the uninterrupted one's losses exactly
    def args(out: Path) -> list[str]:
        return train_args(out, start_model, iterations=3) + ["trainer.mode=one_step_off", "learner.num_ranks=1",
                                                              "learner.rollout_is_cap=2", "trainer.eval_every=0"]

    finish(run_cli(args(tmp_path / "full")))
    full = tmp_path / "full" / "run"
    assert by_iteration(full, "async/staleness_max") == {1: 0.0, 2: 1.0, 3: 1.0}
    assert set(by_iteration(full, "async/versions_per_episode_max").values()) == {1.0}

    kill_after_first_checkpoint(run_cli(args(tmp_path / "killed")), tmp_path / "killed" / "run")
    out = finish(run_cli(args(tmp_path / "killed")))
    assert "resumed run after iteration 1" in out and "restored 2 buffered groups" in out
    resumed = tmp_path / "killed" / "run"
    for key in ("learner/loss", "learner/optimizer_steps_total", "rollout/success_rate"):
        expected, got = by_iteration(full, key), by_iteration(resumed, key)
        for iteration in (2, 3):
            assert got[iteration] == pytest.approx(expected[iteration], rel=1e-5, abs=1e-7), (key, iteration)
