"""``agentrl bench learning`` trains a recipe per seed for real and reports validation success after
SFT and after RL, per run and per recipe."""

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128",
        "tokenizer.vocab_size=600", "tokenizer.corpus_tasks=40", "trainer.sft.enabled=false",
        "env.tasks_per_iteration=2", "env.group_size=2", "env.max_steps=4", "rollout.max_response_tokens=8",
        "trainer.iterations=1", "trainer.eval_every=1", "eval.num_tasks=2", "trainer.save_every=0"]


def test_bench_learning_runs_each_seed_and_writes_the_tables(tmp_path):
    out = tmp_path / "bench"
    # started from a process whose own learner holds its rendezvous port (a test session's in-process
    # learner set MASTER_PORT): each run is a run of its own and must not bind that port again
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(taken.getsockname()[1]),
               "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
        done = subprocess.run([sys.executable, "-m", "agentrl.cli.main", "bench", "learning", "--json",
                               "--recipes", "textcraft_grpo_tiny", "--seeds", "0", "--out", str(out), *TINY],
                              capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["meta"]["overrides"] == TINY
    [run] = report["results"]
    assert (run["recipe"], run["seed"], run["returncode"], run["iterations"]) == ("textcraft_grpo_tiny", 0, 0, 1)
    assert 0.0 <= run["val_start"] <= 1.0 and 0.0 <= run["val_end"] <= 1.0 and run["iteration_s_mean"] > 0
    [line] = [line for line in done.stderr.splitlines() if line.startswith('{"recipe": ')]  # each run's, on stderr
    assert json.loads(line) == run
    assert json.loads((out / "results.json").read_text()) == report["results"]
    table = (out / "table.md").read_text().splitlines()
    assert table[2].startswith("| textcraft_grpo_tiny | 0 | ") and table[-1].startswith("| textcraft_grpo_tiny | 1 | ")
