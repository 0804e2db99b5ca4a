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
                               "--warmup", "1", "--modes", "sync,async+learner.torch_threads=1+trainer.max_staleness=1",
                               "--scratch", str(tmp_path), *TINY], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["meta"]["recipe"] == "textcraft_grpo_tiny" and report["meta"]["overrides"] == TINY
    # iteration 3 is left out: async's rollout runs one iteration ahead, and in the last one it has nothing left
    # to overlap with its update; sync is timed over the same iteration
    assert report["meta"]["timed"] == [2, 2] and report["meta"]["drain"] == 1
    sync, overlapped = report["results"]["sync"], report["results"]["async+learner.torch_threads=1+trainer.max_staleness=1"]
    assert sync["speedup_vs_sync"] == 1.0 and overlapped["baseline"] == "sync"
    assert overlapped["speedup_vs_sync"] == pytest.approx(overlapped["env_steps_per_s"] / sync["env_steps_per_s"])
    for r in (sync, overlapped):
        assert r["env_steps_per_s"] > 0 and r["iterations_per_hour"] > 0 and len(r["rounds"]) == 1
    # async's staleness depends on when the weights reach the worker; it never exceeds trainer.max_staleness
    assert sync["staleness_mean"] == 0.0 and 0.0 <= overlapped["staleness_mean"] <= 1.0
    # each mode ran in its own run directory from the one SFT-free start
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["async-1-0", "sync-0-0", "sync-0-0-2"]
    assert (earlier / "metrics.jsonl").read_text() == "{}\n"
    config = (tmp_path / "runs" / "async-1-0" / "config.yaml").read_text()
    assert "mode: async" in config and "torch_threads: 1" in config and "max_staleness: 1" in config


def test_the_timed_window_leaves_out_the_drain_and_each_mode_meets_its_own_sync(tmp_path):
    from agentrl.bench.modes import baseline_of, drain_iterations, throughput

    assert drain_iterations("sync", []) == 0 and drain_iterations("one_step_off", []) == 1
    assert drain_iterations("async", []) == 2 and drain_iterations("async", ["trainer.max_staleness=3"]) == 3
    assert drain_iterations("async+trainer.max_staleness=1", ["trainer.max_staleness=3"]) == 1
    specs = ["sync", "sync+learner.torch_threads=1", "async", "async+learner.torch_threads=1", "async+trainer.max_staleness=1"]
    assert [baseline_of(s, specs) for s in specs] == ["sync", "sync+learner.torch_threads=1", "sync",
                                                     "sync+learner.torch_threads=1", "sync"]
    assert baseline_of("async", ["async"]) is None
    # iterations 1-6, 10 s each with 100 env steps, but the last two (the drain) take 30 s with 100 steps:
    # timed over iterations 3-4 (after warmup 2, before the drain of 2) the rate is the steady state's 10/s
    lines = [json.dumps({"step": k, "time": 10.0 * k if k <= 4 else 40.0 + 30.0 * (k - 4), "learner/loss": 0.0,
                         "rollout/env_steps": 100.0}) for k in range(1, 7)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    steady = throughput(tmp_path, first=2, last=4)
    assert steady["env_steps_per_s"] == 10.0 and steady["iterations_per_hour"] == 360.0
    assert throughput(tmp_path, first=2, last=6)["env_steps_per_s"] == pytest.approx(400 / 80)   # drain counted: 5/s


def test_bench_modes_refuses_an_unknown_mode(tmp_path):
    done = subprocess.run([sys.executable, "-m", "agentrl.cli.main", "bench", "modes", "--modes", "sync,fast",
                           "--scratch", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "unknown mode(s) ['fast'] in --modes" in done.stderr
