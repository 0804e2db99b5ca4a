"""scripts/smoke_report.py, the wrapper of agentrl.runs.smoke_report (the metrics parser of the GPU
checklist's smoke stage), on CPU.

RUN_RECORD is the iteration record of a real run's metrics.jsonl: `agentrl train
recipe=textcraft_grpo_tiny` with hidden-64 tiny settings, 1 iteration, 2 tasks x 2 rollouts, the
torch backend and 1 learner rank. A last test checks that the trainer and learner still emit
the keys the report reads, so a renamed metric fails here rather than on a GPU node.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "smoke_report.py"

spec = importlib.util.spec_from_file_location("smoke_report", SCRIPT)
smoke_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(smoke_report)

RUN_RECORD = {'step': 1,
 'time': 1795297236.6792076,
 'rollout/success_rate': 0.0,
 'rollout/episode_return': -0.4,
 'rollout/episode_length': 4.0,
 'rollout/invalid_action_rate': 1.0,
 'rollout/episodes': 4.0,
 'rollout/success_rate/depth2': 0.0,
 'rollout/step_records': 16.0,
 'rollout/response_tokens': 122.0,
 'rollout/mixed_outcome_groups': 0.0,
 'estimator/num_groups': 2.0,
 'estimator/singleton_group_rate': 0.0,
 'learner/loss': 1.3877787374133588e-11,
 'learner/pg_loss': 1.3877787374133588e-11,
 'learner/entropy': 6.28004002571106,
 'learner/pg_clipfrac': 0.0,
 'learner/pg_clipfrac_lower': 0.0,
 'learner/approx_kl': -3.339915072478232e-09,
 'learner/ratio_mean': 0.9999999732806765,
 'learner/ratio_max': 1.0000007152557373,
 'learner/ratio_min': 0.9999995231628418,
 'learner/lr': 5e-05,
 'learner/grad_norm': 2.385577933111671e-11,
 'learner/optimizer_steps': 2.0,
 'learner/skipped_steps': 0.0,
 'learner/skipped_micro_batches': 0.0,
 'learner/tokens_per_s': 9552.129609447513,
 'learner/rollout_logprob_gap_mean': 1.1920928955078125e-07,
 'learner/rollout_logprob_gap_max': 4.76837158203125e-07,
 'learner/update_s': 0.866508342999623,
 'time/rollout_s': 0.17305407999992894,
 'time/learner_pass_s': 0.26867643799960206,
 'time/estimate_s': 0.0010949829993478488,
 'time/update_s': 0.8670326600004046,
 'time/sync_s': 0.010202193999248266,
 'time/iteration_s': 1.3200603549985317}


def write_metrics(path: Path, records, torn_tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn_tail)
    return path


def test_real_tiny_run_record(tmp_path):
    path = write_metrics(tmp_path / "metrics.jsonl", [RUN_RECORD])
    rows = smoke_report.iteration_rows(smoke_report.load_records(path))
    assert len(rows) == 1
    row = rows[0]
    assert row["iteration"] == 1
    assert row["rollout_tokens_per_s"] == pytest.approx(122.0 / 0.17305407999992894)
    assert row["learner_tokens_per_s"] == pytest.approx(9552.129609447513)
    assert row["iteration_s"] == pytest.approx(1.3200603549985317)
    assert row["logprob_gap_max"] == pytest.approx(4.76837158203125e-07)
    summary = smoke_report.summarize(rows)
    assert "4.77e-07)" in smoke_report.format_report(rows, summary)
    assert summary["iterations"] == 1 and summary["averaged_over"] == [1]
    assert summary["iteration_s"] == pytest.approx(1.3200603549985317)


def test_several_iterations_skip_first_and_ignore_other_records(tmp_path):
    sft = {"step": 0, "time": 0.0, "sft/loss": 2.0}
    validation = {"step": 0, "time": 0.0, "val/success_rate": 0.1, "time/validation_s": 3.0}
    it1 = {**RUN_RECORD, "step": 1, "time/iteration_s": 10.0, "time/rollout_s": 4.0,
           "rollout/response_tokens": 400.0, "learner/tokens_per_s": 100.0}
    it2 = {**RUN_RECORD, "step": 2, "time/iteration_s": 2.0, "time/rollout_s": 1.0,
           "rollout/response_tokens": 300.0, "learner/tokens_per_s": 500.0}
    it3 = {**it2, "step": 3, "time/iteration_s": 4.0, "rollout/response_tokens": 500.0, "learner/tokens_per_s": 700.0}
    path = write_metrics(tmp_path / "metrics.jsonl", [sft, validation, it1, it2, it3])
    rows = smoke_report.iteration_rows(smoke_report.load_records(path))
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    summary = smoke_report.summarize(rows)
    assert summary["averaged_over"] == [2, 3]
    assert summary["rollout_tokens_per_s"] == pytest.approx(400.0)
    assert summary["learner_tokens_per_s"] == pytest.approx(600.0)
    assert summary["iteration_s"] == pytest.approx(3.0)
    text = smoke_report.format_report(rows, summary)
    assert "mean over iterations 2-3" in text and "rollout tokens/s 400.0" in text


def test_torn_line_and_repeated_iteration_after_resume(tmp_path):
    first = {**RUN_RECORD, "step": 1, "time/iteration_s": 9.0}
    again = {**RUN_RECORD, "step": 1, "time/iteration_s": 5.0}
    path = write_metrics(tmp_path / "metrics.jsonl", [first, again], torn_tail='{"step": 2, "time/iter')
    rows = smoke_report.iteration_rows(smoke_report.load_records(path))
    assert len(rows) == 1 and rows[0]["iteration_s"] == 5.0


def test_zero_rollout_time_gives_zero_rate():
    rows = smoke_report.iteration_rows([{**RUN_RECORD, "time/rollout_s": 0.0}])
    assert rows[0]["rollout_tokens_per_s"] == 0.0


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_command_line_exit_codes(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_metrics(run_dir / "metrics.jsonl", [RUN_RECORD])
    ok = run_script(run_dir)
    assert ok.returncode == 0, ok.stderr
    assert "learner tokens/s 9552.1" in ok.stdout
    short = run_script(run_dir, "--expect-iterations", "2")
    assert short.returncode == 1 and "expected 2" in short.stderr
    as_json = run_script(run_dir / "metrics.jsonl", "--json")
    assert json.loads(as_json.stdout)["summary"]["iterations"] == 1
    assert run_script(tmp_path / "missing").returncode == 2
    (tmp_path / "empty.jsonl").write_text("")
    assert run_script(tmp_path / "empty.jsonl").returncode == 1


def test_the_trainer_still_logs_the_keys_the_report_reads():
    # the trainer's loop and the metrics it logs (agentrl/training/, since the modules were grouped)
    trainer = "".join((ROOT / "agentrl" / "training" / name).read_text() for name in ("trainer.py", "metrics.py"))
    tracking = (ROOT / "agentrl" / "runs" / "tracking.py").read_text()
    update = (ROOT / "agentrl" / "learner" / "update.py").read_text()   # Learner.update
    # phase timings are time/<phase>_s (agentrl.runs.tracking.Phases), iteration time their sum
    assert 'f"time/{name}_s"' in tracking and '"time/iteration_s"' in tracking
    for name in ("rollout", "learner_pass", "update", "sync", "sleep"):
        assert f'phase("{name}")' in trainer, name
    for key in ("response_tokens", "step_records", "learner/rollout_logprob_gap_max"):
        assert key in trainer, key
    assert "tokens_per_s=" in update
    for key in ("time/iteration_s", "time/rollout_s", "rollout/response_tokens", "learner/tokens_per_s"):
        assert key in RUN_RECORD, key
