"""scripts/reproduce_mini.sh: the torch thread count it gives each sweep cell, and its argument check.

The script runs the real `agentrl sweep ... --dry-run` (this interpreter's agentrl), which lists the cells
and runs nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reproduce_mini.sh"


def _run_script(tmp_path, *args, env_threads=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(AGENTRL=f"{sys.executable} -m agentrl.cli.main", OUT=str(tmp_path / "sweep"))
    if env_threads is not None:
        env["OMP_NUM_THREADS"] = env_threads
    return subprocess.run(["bash", str(SCRIPT), *args, "--dry-run"], env=env, capture_output=True, text=True,
                          timeout=120)


def _threads_line(proc: subprocess.CompletedProcess) -> str:
    return next(line for line in proc.stderr.splitlines() if line.startswith("reproduce_mini.sh: OMP_NUM_THREADS="))


def _cores() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize("args, cells", [((), 1), (("--concurrency", "2"), 2), (("--concurrency=3",), 3)])
def test_threads_default_to_the_cores_shared_by_the_cells_at_once(tmp_path, args, cells):
    proc = _run_script(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    assert _threads_line(proc) == (f"reproduce_mini.sh: OMP_NUM_THREADS={max(1, _cores() // cells)} "
                                   f"for each of the {cells} cell(s) at once")
    # the arguments reached the real sweep command: its dry run lists the twelve cells, runs none
    listed = [line for line in proc.stdout.splitlines() if line and not line.startswith(" ")]
    assert len(listed) == 12 and "textcraft_grpo_tiny-seed0" in listed
    assert f"trainer.output_dir={tmp_path / 'sweep' / 'runs'}" in proc.stdout
    assert not (tmp_path / "sweep" / "runs").exists()


def test_a_thread_count_of_the_callers_wins(tmp_path):
    proc = _run_script(tmp_path, "--concurrency", "2", env_threads="1")
    assert proc.returncode == 0, proc.stderr
    assert _threads_line(proc) == "reproduce_mini.sh: OMP_NUM_THREADS=1 for each of the 2 cell(s) at once"


def test_a_bad_concurrency_is_refused_before_any_run(tmp_path):
    proc = _run_script(tmp_path, "--concurrency", "two")
    assert proc.returncode == 2
    assert "--concurrency must be a whole number >= 1, got 'two'" in proc.stderr
    assert proc.stdout == "", "the sweep command must not have run"
