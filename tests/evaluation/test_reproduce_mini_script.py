"""scripts/reproduce_mini.sh: the torch thread count it gives each sweep cell, and its argument check."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reproduce_mini.sh"


def _run_script(tmp_path, *args, env_threads=None):
    """Run the script with a stand-in `agentrl` that records its thread count and arguments."""
    record = tmp_path / "record"
    stub = tmp_path / "agentrl_stub"
    stub.write_text(f'#!/usr/bin/env bash\necho "$OMP_NUM_THREADS" > {record}\necho "$@" >> {record}\n')
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["AGENTRL"] = str(stub)
    if env_threads is not None:
        env["OMP_NUM_THREADS"] = env_threads
    proc = subprocess.run(["bash", str(SCRIPT), *args, "--dry-run"], env=env, capture_output=True, text=True,
                          timeout=60)
    lines = record.read_text().splitlines() if record.exists() else []
    return proc, lines


def _cores() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize("args, cells", [((), 1), (("--concurrency", "2"), 2), (("--concurrency=3",), 3)])
def test_threads_default_to_the_cores_shared_by_the_cells_at_once(tmp_path, args, cells):
    proc, lines = _run_script(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    assert lines[0] == str(max(1, _cores() // cells))
    assert lines[1].startswith("sweep sweep=sweeps/mini_textcraft.yaml out=runs/sweeps/mini_textcraft")
    assert "--dry-run" in lines[1]


def test_a_thread_count_of_the_callers_wins(tmp_path):
    proc, lines = _run_script(tmp_path, "--concurrency", "2", env_threads="1")
    assert proc.returncode == 0, proc.stderr
    assert lines[0] == "1"


def test_a_bad_concurrency_is_refused_before_any_run(tmp_path):
    proc, lines = _run_script(tmp_path, "--concurrency", "two")
    assert proc.returncode == 2
    assert "--concurrency must be a whole number >= 1, got 'two'" in proc.stderr
    assert lines == []
