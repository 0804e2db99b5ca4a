"""Tiny `agentrl train` runs through the real CLI, shared by the end-to-end tests: the settings, the
subprocess, the kill after the first checkpoint and the losses of a run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentrl.runs.tracking import read_metrics

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128",
        "model.tiny.num_heads=4", "model.tiny.num_kv_heads=2", "tokenizer.vocab_size=600", "tokenizer.corpus_tasks=40"]
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def train_args(out: Path, start_model: str, iterations: int = 2) -> list[str]:
    return ["train", "recipe=textcraft_gigpo_tiny", *TINY, f"trainer.output_dir={out}", "trainer.run_name=run",
            f"trainer.init_checkpoint={start_model}", f"trainer.iterations={iterations}", "trainer.save_every=1",
            "trainer.eval_every=2", "trainer.eval_before_train=false", "eval.num_tasks=2",
            "env.tasks_per_iteration=2", "env.group_size=2", "env.max_steps=4", "rollout.max_response_tokens=8",
            "learner.num_ranks=2", "learner.zero_stage=2", "learner.mini_batch_size=8", "learner.micro_batch_size=4",
            "learner.lr=1e-3", "learner.kl_coef=0.01", "learner.entropy_coef=0.01",
            "logging.wandb.mode=offline", "logging.progress_bar=true",
            # a random policy never wins and every step gets the same invalid-action penalty, so the
            # advantages are 0: the entropy bonus is what moves the weights in every update
            "rollout.invalid_action_penalty=0.1", "learner.skip_zero_advantage=false"]


def run_cli(args: list[str], extra_env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """`agentrl <args>` in a session of its own (so its whole process group can be killed), without
    an inherited rendezvous; ``extra_env`` on top (e.g. the session's shared Ray head)."""
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    env.update(RAY_USAGE_STATS_ENABLED="0", WANDB_SILENT="true", OMP_NUM_THREADS="1", **(extra_env or {}))
    return subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", *args], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def kill_after_first_checkpoint(proc: subprocess.Popen, run_dir: Path) -> None:
    """SIGKILL a training run (its whole process group) as soon as its first checkpoint is complete."""
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + 600
    while not latest.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert latest.exists(), "the first checkpoint never appeared"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def iteration_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["learner/loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "learner/loss" in r}
