"""``agentrl bench parity``'s arithmetic on hand-made runs: training time without the validations,
the paired per-layout difference and its interval, and the equal-time point."""

import json
import math
from types import SimpleNamespace

import pytest

from agentrl.bench import parity


def write_run(run_dir, times, validations, won):
    """``times``: iteration -> end time; ``validations``: iteration -> seconds; ``won``: iteration -> [0/1 per layout]."""
    (run_dir / "validation").mkdir(parents=True)
    rows = [{"step": 0, "time": 100.0, "val/success_rate": 0.5, "time/validation_s": 10.0}]
    for k, t in times.items():
        rows.append({"step": k, "time": t, "time/iteration_s": 1.0, "learner/loss": 0.0})
        if k in validations:
            rows.append({"step": k, "time": t + validations[k], "val/success_rate": 0.0, "time/validation_s": validations[k]})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for k, outcome in won.items():
        lines = [json.dumps({"seed": 0, "task": {"split": "test", "index": i}, "task_type": "t", "won": bool(w),
                             "return": float(w), "length": 3}) for i, w in enumerate(outcome)]
        (run_dir / "validation" / f"iter_{k:06d}.jsonl").write_text("\n".join(lines) + "\n")


def test_training_time_leaves_the_validations_out(tmp_path):
    write_run(tmp_path, {1: 110.0, 2: 140.0, 3: 150.0}, {2: 20.0}, {})
    # iteration 2's validation (20 s, after iteration 2 ended) is not training time for iteration 3
    assert parity.training_seconds(tmp_path) == {1: 10.0, 2: 40.0, 3: 30.0}


def test_paired_difference_per_layout():
    sync = {(0, "test", i): w for i, w in enumerate([1, 1, 0, 0, 1, 0, 1, 0])}
    compared = {(0, "test", i): w for i, w in enumerate([1, 0, 1, 1, 1, 0, 1, 0])}
    result = parity.paired(sync, compared)
    assert result["sync"] == 0.5 and result["compared"] == 0.625 and result["diff"] == pytest.approx(0.125)
    assert result["only_compared_won"] == 2 and result["only_sync_won"] == 1 and result["layouts"] == 8
    diffs = [0, -1, 1, 1, 0, 0, 0, 0]
    sd = math.sqrt(sum((d - 0.125) ** 2 for d in diffs) / 7)
    assert result["diff_95"] == pytest.approx(2.365 * sd / math.sqrt(8))
    assert parity.mean_interval([0.1])[1] != parity.mean_interval([0.1])[1]    # nan with one value


def test_the_compared_run_is_read_at_equal_iterations_and_at_equal_training_time(tmp_path, monkeypatch):
    # sync: 4 iterations, 40 s of training; async: 8 iterations, validated every 2, at 32, 54, 74, 98 s
    write_run(tmp_path / "runs" / "sync-seed0", {2: 130.0, 4: 150.0}, {2: 10.0, 4: 10.0},
              {0: [0, 0, 1, 1], 2: [0, 1, 1, 1], 4: [1, 1, 0, 1]})
    write_run(tmp_path / "runs" / "async-seed0", {2: 132.0, 4: 164.0, 6: 194.0, 8: 228.0}, {2: 10.0, 4: 10.0, 6: 10.0, 8: 10.0},
              {0: [0, 0, 1, 1], 2: [0, 0, 1, 1], 4: [1, 1, 1, 1], 6: [1, 1, 1, 0], 8: [1, 1, 1, 1]})
    for name in ("sync-seed0", "async-seed0"):
        (tmp_path / "runs" / name / "final_model").mkdir()      # finished: the bench reads, it does not train
    args = SimpleNamespace(recipe="textcraft_grpo_tiny", compared="async", seeds="0", iterations=4,
                           compared_iterations=8, eval_every=2, out=str(tmp_path), overrides=[])
    report = parity.measure(args)
    row = report["results"]["seeds"][0]
    assert row["sync_training_s"] == 40.0 and row["warm_start"] == 0.5
    assert row["equal_iterations"]["diff"] == pytest.approx(0.25)       # 4/4 vs 3/4
    # the last validation of async within sync's 40 s of training is at iteration 2 (32 s; 54 s at 4)
    assert row["equal_time_iteration"] == 2 and row["equal_time"]["diff"] == pytest.approx(-0.25)
    assert report["results"]["summary"]["equal_iterations"]["seeds_compared_ahead"] == 1
    assert json.loads((tmp_path / "parity.json").read_text())["results"]["seeds"][0]["seed"] == 0


def test_sync_compared_with_sync_under_overrides_needs_a_name_of_its_own(tmp_path):
    args = SimpleNamespace(recipe="textcraft_grpo_tiny", compared="sync+rollout.agent=x:y", compared_name="",
                           seeds="0", iterations=4, compared_iterations=4, eval_every=2, out=str(tmp_path), overrides=[])
    with pytest.raises(SystemExit, match="--compared-name"):
        parity.measure(args)
    # named, the compared runs have directories of their own (found finished here, so nothing trains)
    write_run(tmp_path / "runs" / "sync-seed0", {2: 130.0, 4: 150.0}, {2: 10.0, 4: 10.0},
              {0: [0, 1], 2: [0, 1], 4: [1, 1]})
    write_run(tmp_path / "runs" / "gateway-seed0", {2: 131.0, 4: 152.0}, {2: 10.0, 4: 10.0},
              {0: [0, 1], 2: [1, 1], 4: [0, 1]})
    for name in ("sync-seed0", "gateway-seed0"):
        (tmp_path / "runs" / name / "final_model").mkdir()
    args.compared_name = "gateway"
    row = parity.measure(args)["results"]["seeds"][0]
    assert row["equal_iterations"]["diff"] == pytest.approx(-0.5)


def test_share_sft_starts_later_seeds_from_the_first_seeds_sft_model(tmp_path, monkeypatch):
    calls = []
    for name in ("sync-seed0", "gateway-seed0", "sync-seed1", "gateway-seed1"):
        write_run(tmp_path / "runs" / name, {2: 130.0}, {2: 10.0}, {0: [0, 1], 2: [1, 1]})
    (tmp_path / "runs" / "sync-seed0" / "sft_model").mkdir()

    def fake_train(args, name, mode, iterations, seed, extra):
        calls.append((name, list(extra)))
        return tmp_path / "runs" / name

    monkeypatch.setattr(parity, "train", fake_train)
    args = SimpleNamespace(recipe="textcraft_grpo_tiny", compared="sync+rollout.agent=x:y", compared_name="gateway",
                           seeds="0,1", iterations=2, compared_iterations=2, eval_every=2, out=str(tmp_path),
                           overrides=[], share_sft=True)
    parity.measure(args)
    start = f"trainer.init_checkpoint={tmp_path / 'runs' / 'sync-seed0' / 'sft_model'}"
    assert calls == [("sync-seed0", []), ("gateway-seed0", ["rollout.agent=x:y"]),
                     ("sync-seed1", [start]), ("gateway-seed1", [start, "rollout.agent=x:y"])]


def test_each_runs_gain_over_its_warm_start_is_paired_per_layout_and_pooled_over_seeds(tmp_path):
    won = {"sync-seed0": {0: [0, 0, 1, 1], 4: [1, 0, 1, 1]}, "pgx-seed0": {0: [0, 0, 1, 1], 4: [1, 1, 1, 1]},
           "sync-seed1": {0: [0, 1, 0, 1], 4: [0, 1, 0, 1]}, "pgx-seed1": {0: [0, 1, 0, 1], 4: [1, 1, 0, 0]}}
    for name, outcome in won.items():
        write_run(tmp_path / "runs" / name, {2: 130.0, 4: 150.0}, {4: 10.0}, outcome)
        (tmp_path / "runs" / name / "final_model").mkdir()
    args = SimpleNamespace(recipe="textcraft_grpo_tiny", compared="sync+learner.policy_loss=gspo", compared_name="pgx",
                           seeds="0,1", iterations=4, compared_iterations=4, eval_every=4, out=str(tmp_path), overrides=[])
    report = parity.measure(args)
    seeds, summary = report["results"]["seeds"], report["results"]["summary"]
    assert [r["sync_gain"]["diff"] for r in seeds] == [0.25, 0.0]
    assert [r["compared_gain"]["diff"] for r in seeds] == [0.5, 0.0]
    assert summary["compared_gain"]["diff"] == pytest.approx(0.25)
    # pooled: 8 (seed, layout) pairs; compared minus sync at iteration 4: +1 (seed 0), +1 and -1 (seed 1)
    pooled = summary["equal_iterations"]["pooled"]
    assert pooled["layouts"] == 8 and pooled["diff"] == pytest.approx(1 / 8)
    assert summary["sync_gain"]["pooled"]["diff"] == pytest.approx(1 / 8)
    parity.show(report["meta"], report["results"])
