"""``agentrl bench modes``: each trainer.mode trains the same tiny recipe in a process of its own
and the report gives env steps/s, iterations/hour and the ratio to sync."""

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128",
        "tokenizer.vocab_size=600", "tokenizer.corpus_tasks=40", "trainer.sft.enabled=false",
        "env.tasks_per_iteration=2", "env.group_size=2", "env.max_steps=4", "rollout.max_response_tokens=8"]


def test_bench_modes_reports_each_mode_side_by_side(tmp_path):
    # started from a process whose learner holds its rendezvous port (as pytest's own does after an
    # in-process learner test): the runs must not inherit it
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(held.getsockname()[1]), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    # an earlier bench's run of the same name in this scratch directory is neither resumed nor touched
    earlier = tmp_path / "runs" / "sync-0-0"
    earlier.mkdir(parents=True)
    (earlier / "metrics.jsonl").write_text("{}\n")
    with held:
        done = subprocess.run([sys.executable, "-m", "agentrl.cli.main", "bench", "modes", "--json", "--iterations", "3",
                               "--warmup", "1", "--modes", "sync,async+learner.torch_threads=1", "--scratch", str(tmp_path),
                               *TINY], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["meta"]["recipe"] == "textcraft_grpo_tiny" and report["meta"]["overrides"] == TINY
    sync, overlapped = report["results"]["sync"], report["results"]["async+learner.torch_threads=1"]
    assert sync["speedup_vs_sync"] == 1.0
    assert overlapped["speedup_vs_sync"] == pytest.approx(overlapped["env_steps_per_s"] / sync["env_steps_per_s"])
    for r in (sync, overlapped):
        assert r["env_steps_per_s"] > 0 and r["iterations_per_hour"] > 0 and len(r["rounds"]) == 1
    # async's staleness depends on when the weights reach the worker (0 when every call starts after
    # the last sync); it never exceeds trainer.max_staleness (2)
    assert sync["staleness_mean"] == 0.0 and 0.0 <= overlapped["staleness_mean"] <= 2.0
    # each mode ran in its own run directory from the one SFT-free start
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["async-1-0", "sync-0-0", "sync-0-0-2"]
    assert (earlier / "metrics.jsonl").read_text() == "{}\n"
    config = (tmp_path / "runs" / "async-1-0" / "config.yaml").read_text()
    assert "mode: async" in config and "torch_threads: 1" in config


def test_bench_modes_refuses_an_unknown_mode(tmp_path):
    done = subprocess.run([sys.executable, "-m", "agentrl.cli.main", "bench", "modes", "--modes", "sync,fast",
                           "--scratch", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "unknown mode(s) ['fast'] in --modes" in done.stderr
