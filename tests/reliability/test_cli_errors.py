"""Fault 7: bad configuration and inputs at `agentrl train` give one line naming the problem and the
fix, exit code 2, and leave the output directory as it was (the GPU-recipe case is
tests/cli/test_train_cli.py::test_gpu_recipe_without_gpu_is_refused_before_anything_is_written)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentrl.cli.main import main as cli_main
from reliability_kit import record_figures

CASES = [
    (["recipe=no_such_recipe"], "unknown recipe"),
    (["recipe=textcraft_grpo_tiny", "learner.lrr=1e-3"], "did you mean `learner.lr`"),
    (["recipe=textcraft_grpo_tiny", "learner.lr=fast"], "learner.lr"),
    (["recipe=textcraft_grpo_tiny", "model.name_or_path=/nonexistent"], "no such directory"),
    (["recipe=textcraft_grpo_tiny", "trainer.init_checkpoint=/nonexistent"], "not a model directory"),
]


def run_train(args, out) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "agentrl.cli.main", "train", *args, f"trainer.output_dir={out}"],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, fragment", CASES)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, args, fragment):
    out = tmp_path / "runs"
    out.mkdir()
    proc = run_train(args, out)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("agentrl: error: ") and fragment in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert list(out.iterdir()) == []
    record_figures(f"bad CLI input {args[-1]}", exit_code=proc.returncode, error_lines=len(lines), files_written=0)


def test_output_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = run_train(["recipe=textcraft_grpo_tiny"], blocker / "runs")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "trainer.output_dir" in lines[0] and "is a file" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.parametrize("agent, fragment", [
    ("nonexistent.module:fn", "cannot import nonexistent.module"),
    ("json:nope", "json has no nope"),
    ("json:__name__", "is not callable"),
    ("json", "give module:function"),
])
def test_a_bad_outside_agent_is_refused_before_anything_starts(tmp_path, capsys, agent, fragment):
    """Before, rollout.agent was loaded only inside the Ray rollout worker, after the tokenizer, Ray and
    the model: exit 1 and a 52-66-line traceback 20-30 s later."""
    out = tmp_path / "runs"
    out.mkdir()
    code = cli_main(["train", "recipe=textcraft_grpo_tiny", "rollout.expert_guidance=false", f"rollout.agent={agent}",
                     f"trainer.output_dir={out}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("agentrl: error: rollout.agent=") and fragment in lines[0]
    assert list(out.iterdir()) == []
