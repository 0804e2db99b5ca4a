"""`agentrl train` against a standalone env server that dies for good: past rollout.max_env_failures
the run stops with one line and exit code 2, and its newest checkpoint is complete and resumable."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.models import prepare_initial_model
from agentrl.warmstart.starting_policy import corpus_builder

pytestmark = pytest.mark.slow

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128",
        "tokenizer.vocab_size=600", "tokenizer.corpus_tasks=40"]
ENV = {**{k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")},
       "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_textcraft(port: int) -> subprocess.Popen:
    """`agentrl envs serve textcraft` on loopback (4 instances of 3 steps), once it answers /health."""
    server = subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", "envs", "serve", "textcraft", "--port",
                               str(port), "--size", "4", "--env-kwargs", '{"max_steps": 3}'], env=ENV,
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    return server


def train_until_first_checkpoint(tmp_path, port: int, *extra: str, ray_env: dict[str, str] | None = None
                                 ) -> tuple[subprocess.Popen, Path]:
    """`agentrl train` of a tiny model against the env server at ``port``, 50 iterations with a
    checkpoint after each; returns once the first checkpoint is complete (and its ``latest`` file).
    ``ray_env``: the Ray cluster to join (tests/conftest.py::ray_head)."""
    cfg = load_config("textcraft_grpo_tiny", TINY)
    model = prepare_initial_model(cfg.model, cfg.tokenizer, tmp_path / "init", corpus=corpus_builder(cfg))
    out = tmp_path / "runs"
    train = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli.main", "train", "recipe=textcraft_grpo_tiny", *TINY,
         f"trainer.init_checkpoint={model}", f"trainer.output_dir={out}", "trainer.run_name=run",
         f"env.server_url=http://127.0.0.1:{port}", "env.tasks_per_iteration=2", "env.group_size=2",
         "env.max_steps=3", "rollout.max_response_tokens=8", "trainer.iterations=50", "trainer.save_every=1",
         "trainer.eval_before_train=false", "trainer.eval_every=0", "logging.wandb.mode=disabled", *extra],
        env={**ENV, **(ray_env or {})}, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    latest = out / "run" / "checkpoints" / "latest"
    deadline = time.time() + 400
    while not latest.exists() and time.time() < deadline and train.poll() is None:
        time.sleep(0.2)
    return train, latest


def train_until_the_env_server_dies(tmp_path, *extra: str, ray_env: dict[str, str] | None = None
                                    ) -> tuple[str, Path, Path]:
    """A training run against a standalone env server that is killed for good once the first
    checkpoint is complete; it must stop with exit code 2. The run's output, its checkpoints folder and its newest
    checkpoint. The stop must be one line, never a traceback."""
    port = free_port()
    server = serve_textcraft(port)
    try:
        train, latest = train_until_first_checkpoint(tmp_path, port, *extra, ray_env=ray_env)
        assert latest.exists(), "no checkpoint before the fault"
        os.killpg(server.pid, signal.SIGKILL)  # the env server dies for good
        log, _ = train.communicate(timeout=400)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    assert train.returncode == 2, log[-3000:]
    last_line = log.strip().splitlines()[-1]
    assert last_line.startswith("agentrl: error: training stopped in iteration") and "resume" in last_line
    assert "Traceback" not in log
    checkpoints = tmp_path / "runs" / "run" / "checkpoints"
    return log, checkpoints, checkpoints / latest.read_text().strip()


def test_dead_env_server_stops_training_with_a_checkpoint(tmp_path, ray_head):
    log, checkpoints, newest = train_until_the_env_server_dies(tmp_path, "rollout.max_env_failures=1",
                                                                ray_env=ray_head)
    assert (newest / "trainer_state.json").is_file() and (newest / "learner").is_dir()
    assert not list(checkpoints.glob("*.partial"))
