"""`agentrl sweep` on tiny settings: killed after its first cell, restarted; failing cells recorded;
then `agentrl table` and the learning-curve plot from the real results."""

import csv
import json
import os
import signal
import socket
import time

import pytest
import yaml

from agentrl.errors import UsageError
from agentrl.evaluation.sweep import cell_environment, load_sweep
from eval_cli import TINY, popen_cli, run_cli

pytestmark = pytest.mark.slow


def sweep_file(tmp_path, init_model) -> str:
    spec = {
        "name": "tiny",
        "output_dir": str(tmp_path / "out"),
        "recipes": ["textcraft_grpo_tiny", "textcraft_gigpo_tiny"],
        "seeds": [0],
        "overrides": [*TINY, f"trainer.init_checkpoint={init_model}", "trainer.iterations=1",
                      "trainer.eval_every=1", "trainer.eval_before_train=false", "eval.num_tasks=2",
                      "env.tasks_per_iteration=2", "env.group_size=2", "env.max_steps=3",
                      "rollout.max_response_tokens=8", "learner.mini_batch_size=8", "learner.micro_batch_size=4",
                      "logging.wandb.mode=disabled", "logging.tensorboard=false"],
        "variants": {"ok": [], "bad": ["learner.lr=-1"]},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def manifest(tmp_path) -> dict:
    path = tmp_path / "out" / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {"cells": {}}


@pytest.fixture
def taken_rendezvous_port(monkeypatch):
    """The sweep starts inside a job whose rendezvous port is taken (a launcher's, or an in-process
    learner's): the cells must not inherit it, or their learners fail to bind it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(held.getsockname()[1]))
        yield


def test_sweep_killed_and_restarted_skips_finished_cells_and_records_failures(tmp_path, tiny_policy, ray_head,
                                                                              taken_rendezvous_port):
    """The cells' `agentrl train` join the session's Ray head (the sweep passes its environment on)."""
    path = sweep_file(tmp_path, tiny_policy)
    first_cell = "textcraft_grpo_tiny-ok-seed0"
    proc = popen_cli(["sweep", f"sweep={path}"], extra_env=ray_head)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if manifest(tmp_path)["cells"].get(first_cell, {}).get("state") == "done":
            break
        time.sleep(0.2)
    assert manifest(tmp_path)["cells"][first_cell]["state"] == "done", proc.communicate()[0][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    states = {n: c["state"] for n, c in manifest(tmp_path)["cells"].items()}
    assert list(states) == ["textcraft_grpo_tiny-ok-seed0", "textcraft_grpo_tiny-bad-seed0",
                            "textcraft_gigpo_tiny-ok-seed0", "textcraft_gigpo_tiny-bad-seed0"]
    assert states["textcraft_gigpo_tiny-ok-seed0"] in ("pending", "running")

    restarted = run_cli(["sweep", f"sweep={path}"], timeout=400, extra_env=ray_head)
    out = restarted.stdout
    assert restarted.returncode == 1, out[-3000:]  # some cells failed: status 1, the sweep still finished
    assert "4 cells, 1 already finished, 3 to run" in out
    assert f"[{first_cell}] running" not in out
    cells = manifest(tmp_path)["cells"]
    assert cells[first_cell]["attempts"] == 1
    assert (tmp_path / "out" / "logs" / f"{first_cell}.log").read_text().count("$ agentrl train") == 1
    assert cells["textcraft_gigpo_tiny-ok-seed0"]["state"] == "done"
    assert (tmp_path / "out" / "runs" / "textcraft_gigpo_tiny-ok-seed0" / "final_model" / "config.json").is_file()
    for bad in ("textcraft_grpo_tiny-bad-seed0", "textcraft_gigpo_tiny-bad-seed0"):
        assert cells[bad]["state"] == "failed" and cells[bad]["returncode"] == 2
        assert "learner.lr" in cells[bad]["error"]
        assert f"failed: {bad}" in out
    assert manifest(tmp_path)["counts"] == {"pending": 0, "running": 0, "done": 2, "failed": 2}

    # the table and the learning curves from these real results
    table = run_cli(["table", f"results={tmp_path / 'out'}", "--format", "csv"])
    assert table.returncode == 0, table.stdout[-2000:]
    rows = [r for r in csv.reader(table.stdout.splitlines()) if r[:2] == ["textcraft", "tiny"]]
    measured = {(r[2], r[4]) for r in rows if r[3] == "measured"}
    assert ("GRPO (ok)", "All") in measured and ("GiGPO (ok)", "All") in measured
    assert any(r[3] == "published" for r in rows)
    plot = tmp_path / "out" / "plots" / "curve_textcraft_tiny.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cell_environment_drops_the_rendezvous_and_keeps_the_rest():
    base = {"PATH": "/bin", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "8",
            "LOCAL_RANK": "3", "OMP_NUM_THREADS": "2"}
    env = cell_environment(base, {"OMP_NUM_THREADS": "1", "HF_HOME": "/data"}, gpus="2,3")
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "HF_HOME": "/data", "RAY_USAGE_STATS_ENABLED": "0",
                   "CUDA_VISIBLE_DEVICES": "2,3"}
    assert "CUDA_VISIBLE_DEVICES" not in cell_environment(base, {}, gpus=None)
    assert base["MASTER_PORT"] == "29500"  # the sweep's own environment is left as it was


def test_sweep_file_errors_are_usage_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipes: [no_such_recipe]\n")
    with pytest.raises(UsageError, match="no_such_recipe"):
        load_sweep(bad)
    bad.write_text("recipes: [textcraft_grpo_tiny]\nseedz: [0]\n")
    with pytest.raises(UsageError, match="seedz"):
        load_sweep(bad)
    good = tmp_path / "good.yaml"
    good.write_text("recipes: [textcraft_grpo_tiny]\nseeds: [0, 1]\noverrides: {learner.lr: 1.0e-4}\n"
                    "eval: {split: depth2, seeds: [0, 1]}\n")
    spec = load_sweep(good, str(tmp_path / "o"))
    assert [c.name for c in spec.cells] == ["textcraft_grpo_tiny-seed0", "textcraft_grpo_tiny-seed1"]
    assert spec.cells[0].overrides == ["learner.lr=0.0001"] and spec.concurrency >= 1
    assert spec.eval_args(tmp_path / "run") == ["eval", f"checkpoint={tmp_path / 'run'}", "split=depth2", "seeds=0,1"]
    dry = run_cli(["sweep", f"sweep={good}", f"out={tmp_path / 'o'}", "--dry-run"])
    assert dry.returncode == 0 and "trainer.run_name=textcraft_grpo_tiny-seed1" in dry.stdout
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_cells_share_warm_starts_through_the_sweeps_sft_cache(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"recipes": ["textcraft_grpo_tiny", "textcraft_bipace_tiny"], "seeds": [0, 1],
                                    "output_dir": str(tmp_path / "out")}))
    spec = load_sweep(str(path))
    for cell in spec.cells:
        args = cell.train_args(spec.output_dir / "runs")
        assert f"trainer.sft.cache_dir={tmp_path / 'out' / 'sft_cache'}" in args
    path.write_text(yaml.safe_dump({"recipes": ["textcraft_grpo_tiny"], "output_dir": str(tmp_path / "out"),
                                    "overrides": ["trainer.sft.cache_dir=/elsewhere"]}))
    spec = load_sweep(str(path))
    args = spec.cells[0].train_args(spec.output_dir / "runs")
    assert args.index("trainer.sft.cache_dir=/elsewhere") > args.index(f"trainer.sft.cache_dir={tmp_path / 'out' / 'sft_cache'}")
