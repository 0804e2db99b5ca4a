"""`agentrl train` with trainer.mode one_step_off and async through the real CLI (Ray rollout
workers, env pool actors, DeepSpeed): two learner ranks in async mode, with groups streamed ahead
up to the staleness bound and the off-policy correction at work; a resumed async run trains on the
groups its checkpoint buffered, with the learner's step count continued; a one_step_off run killed
after its first checkpoint and resumed reproduces the uninterrupted run's losses."""

import json
import math
import shutil
from pathlib import Path

import pytest

from agentrl.runs.tracking import read_metrics
from cli_train import kill_after_first_checkpoint, run_cli, train_args

pytestmark = pytest.mark.slow


def by_iteration(run_dir: Path, key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run_dir / "metrics.jsonl") if key in r}


def finish(proc, timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def test_async_two_learner_ranks_streaming_groups_and_a_resume_from_the_buffered_groups(tmp_path, tiny_start_model):
    # 6 iterations with max_staleness 2: the stream runs up to 2 iterations' groups ahead of the
    # learner, so groups are in flight at the checkpoints, staleness reaches its bound and the
    # behaviour weight of the decoupled objective (on by default) differs from 1
    extra = ["trainer.mode=async", "trainer.max_staleness=2", "trainer.keep_checkpoints=10"]
    out = finish(run_cli(train_args(tmp_path / "full", tiny_start_model, iterations=6) + extra))
    run_dir = tmp_path / "full" / "run"
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "learner/loss" in r]
    assert [r["step"] for r in records] == list(range(1, 7)) and all(math.isfinite(r["learner/loss"]) for r in records)
    for r in records:
        assert 0 <= r["async/staleness_max"] <= 2 and r["async/versions_per_episode_max"] >= 1
        for key in ("async/groups_dropped", "async/buffer_groups", "async/groups_in_flight", "time/learner_wait_s",
                    "time/rollout_wait_s", "learner/rollout_is_weight", "learner/tokens_staleness_0"):
            assert key in r, key
    assert max(r["async/staleness_max"] for r in records) == 2
    assert any(r["learner/rollout_is_weight"] != 1.0 for r in records)
    # tokens trained per staleness level add up to the trained tokens of stale groups
    assert sum(r.get("learner/tokens_staleness_2", 0.0) for r in records) > 0
    assert "iter 6/6" in out and (run_dir / "final_model" / "model.safetensors").is_file()
    # every validation's episodes are kept per layout (eval.num_tasks=2, one sampling seed)
    for k in (2, 4, 6):
        episodes = [json.loads(line) for line in (run_dir / "validation" / f"iter_{k:06d}.jsonl").read_text().splitlines()]
        assert [(e["seed"], e["task"]["index"]) for e in episodes] == [(0, 0), (0, 1)]
    saved = {k: json.loads((run_dir / "checkpoints" / f"iter_{k:06d}" / "rollout_buffer" / "stream.json").read_text())
             for k in range(1, 6)}
    assert any(state["in_flight"] for state in saved.values()), saved

    # the run as if killed right after the first checkpoint that buffered a whole iteration's groups:
    # resumed, it trains the next iteration on those groups (the oldest first, as the uninterrupted run
    # did), from the same learner state and step count, so the loss is the same; the groups in flight
    # are played again
    k = next(k for k in range(1, 6) if len(list((run_dir / "checkpoints" / f"iter_{k:06d}" / "rollout_buffer")
                                                .glob("group_*"))) >= 2)
    resumed_dir = tmp_path / "resumed" / "run"
    later = [f"iter_{j:06d}" for j in range(k + 1, 7)]
    shutil.copytree(run_dir, resumed_dir, ignore=shutil.ignore_patterns(*later, "final_model", "wandb"))
    (resumed_dir / "checkpoints" / "latest").write_text(f"iter_{k:06d}")
    kept = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if json.loads(line).get("step", 0) <= k]
    (resumed_dir / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    out = finish(run_cli(train_args(tmp_path / "resumed", tiny_start_model, iterations=k + 1) + extra))
    buffered = len(list((run_dir / "checkpoints" / f"iter_{k:06d}" / "rollout_buffer").glob("group_*")))
    assert f"resumed run after iteration {k}" in out
    assert f"restored {buffered} buffered groups; {len(saved[k]['in_flight'])} groups that were in flight" in out
    for key in ("learner/loss", "learner/pg_loss", "learner/optimizer_steps_total"):
        assert by_iteration(resumed_dir, key)[k + 1] == pytest.approx(by_iteration(run_dir, key)[k + 1], rel=1e-5,
                                                                      abs=1e-7), key


def test_one_step_off_killed_and_resumed_matches_the_uninterrupted_run(tmp_path, tiny_start_model):
    # one_step_off: every rollout call runs on one policy version, so two executions give the same
    # samples and the resumed run must reproduce the uninterrupted one's losses exactly
    def args(out: Path) -> list[str]:
        return train_args(out, tiny_start_model, iterations=3) + ["trainer.mode=one_step_off", "learner.num_ranks=1",
                                                              "trainer.eval_every=0"]

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
