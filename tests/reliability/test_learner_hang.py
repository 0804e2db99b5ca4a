"""Fault 10: a learner rank that stops (SIGSTOP, as a swapping machine or a wedged driver would) in
the middle of `agentrl train`. Its peer times out in a collective after learner.collective_timeout_s
and the run stops with exit code 2 and one line naming the stopped rank, its node and process, and
the last complete checkpoint, instead of waiting for DeepSpeed's 30-minute timeout."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from cli_train import run_cli, train_args
from process_sessions import kill_sessions
from reliability_kit import record_figures

pytestmark = pytest.mark.slow
TIMEOUT_S = 4


def learner_rank_processes(since: float) -> list[psutil.Process]:
    """The Ray worker processes of learner ranks created after ``since`` (their title names the actor)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and cmdline[0].startswith("ray::LearnerRank") and proc.info["create_time"] >= since:
            found.append(proc)
    return found


def test_a_stopped_learner_rank_stops_the_run_with_one_line_within_the_bound(tmp_path, tiny_start_model, ray_head):
    started = time.time()
    train = run_cli([*train_args(tmp_path, tiny_start_model, iterations=30), f"learner.collective_timeout_s={TIMEOUT_S}"],
                    extra_env=ray_head)
    stopped = None
    try:
        latest = tmp_path / "run" / "checkpoints" / "latest"
        deadline = time.time() + 300
        while not latest.exists() and time.time() < deadline and train.poll() is None:
            time.sleep(0.1)
        assert latest.exists(), train.communicate(timeout=60)[0][-3000:]
        ranks = learner_rank_processes(started)
        assert len(ranks) == 2, ranks
        stopped = ranks[-1]
        stopped.suspend()                       # SIGSTOP
        stop_at = time.monotonic()
        output, _ = train.communicate(timeout=300)
        took = time.monotonic() - stop_at
    finally:
        if stopped is not None and stopped.is_running():
            stopped.resume()
        if train.poll() is None:
            kill_sessions([train.pid])
    assert train.returncode == 2, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("agentrl: error:")]
    assert len(errors) == 1 and "Traceback" not in output, output[-3000:]
    assert re.fullmatch(rf"agentrl: error: training stopped in iteration \d+: learner rank [01] \(node [\d.]+, pid "
                        rf"{stopped.pid}\) did not return from \w+ in [\d.]+ s: rank [01] timed out waiting for a peer "
                        rf"in a collective \(learner\.collective_timeout_s={TIMEOUT_S}\); its process is stopped or "
                        r"stuck outside the learner's collectives; checkpoint .*/checkpoints/iter_\d+ is the last "
                        r"complete one; check that node's processes \(and GPU\), then run the same command again to "
                        r"resume", errors[0]), errors[0]
    saved = re.search(r"checkpoint (\S+) is the last complete one", errors[0]).group(1)
    assert (tmp_path / "run" / "checkpoints" / os.path.basename(saved) / "trainer_state.json").is_file()
    # the iteration's rollout (a few s), the collective timeout, the grace for other ranks, the shutdown
    assert took < 60, took
    record_figures("learner rank stopped mid-run", collective_timeout_s=TIMEOUT_S, stop_to_exit_s=round(took, 1),
                   message=errors[0])
