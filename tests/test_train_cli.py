"""`agentrl train` end to end through the real CLI: Ray rollout workers and env pool actors,
DeepSpeed with 2 learner ranks, tracking, checkpoints, and a run killed after iteration 1 and
resumed, which must reproduce the uninterrupted run's iteration-2 loss."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.config import load_config
from agentrl.models import prepare_initial_model
from agentrl.runs.tracking import read_metrics
from agentrl.warmstart.starting_policy import corpus_builder

pytestmark = pytest.mark.slow

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128",
        "model.tiny.num_heads=4", "model.tiny.num_kv_heads=2", "tokenizer.vocab_size=600", "tokenizer.corpus_tasks=40"]


@pytest.fixture(scope="module")
def start_model(tmp_path_factory):
    cfg = load_config("textcraft_gigpo_tiny", TINY)
    path = tmp_path_factory.mktemp("policy") / "init"
    return prepare_initial_model(cfg.model, cfg.tokenizer, path, corpus=corpus_builder(cfg), seed=0)


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


def run_cli(args: list[str], **kwargs) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}  # no inherited rendezvous
    env.update(RAY_USAGE_STATS_ENABLED="0", WANDB_SILENT="true", OMP_NUM_THREADS="1")
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


def test_train_two_ranks_then_kill_and_resume(tmp_path, start_model):
    # the uninterrupted run
    proc = run_cli(train_args(tmp_path / "full", start_model))
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    run_dir = tmp_path / "full" / "run"
    records = read_metrics(run_dir / "metrics.jsonl")
    losses = iteration_losses(run_dir)
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
    iteration_2 = next(r for r in records if r.get("step") == 2 and "learner/loss" in r)
    for key in ("rollout/success_rate", "rollout/invalid_action_rate", "learner/grad_norm", "learner/pg_clipfrac",
                "learner/kl_ref", "learner/entropy", "estimator/num_groups", "time/rollout_s", "time/update_s",
                "time/rollout_generate_s", "time/rollout_env_s", "rollout/generated_tokens"):
        assert key in iteration_2, key
    assert any("val/success_rate" in r for r in records)
    # iteration 2 sampled with the weights synced after iteration 1's update: the rollout backend's
    # log-probs of its tokens match the learner's (both fp32 on CPU)
    assert iteration_2["learner/rollout_logprob_gap_max"] < 1e-3
    assert "iter 2/2" in out  # progress line
    assert "checkpoint after iteration 2 written in" in out and "final model exported in" in out
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (run_dir / "wandb").is_dir()
    # the weights changed, and the final policy loads as a Hugging Face model
    before = load_file(str(Path(start_model) / "model.safetensors"))
    after = load_file(str(run_dir / "final_model" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    # `agentrl export` of the newest checkpoint gives the same weights as the final model
    export = run_cli(["export", f"checkpoint={run_dir}", f"out={tmp_path / 'exported'}"])
    out_export, _ = export.communicate(timeout=300)
    assert export.returncode == 0, out_export[-3000:]
    exported = load_file(str(tmp_path / "exported" / "model.safetensors"))
    assert all(torch.equal(exported[k], after[k]) for k in after)

    # the same run, killed once its iteration-1 checkpoint is complete, then resumed
    kill_after_first_checkpoint(run_cli(train_args(tmp_path / "killed", start_model)), tmp_path / "killed" / "run")
    resumed = run_cli(train_args(tmp_path / "killed", start_model))
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out[-3000:]
    assert "resumed run after iteration 1" in out
    resumed_losses = iteration_losses(tmp_path / "killed" / "run")
    assert resumed_losses[2] == pytest.approx(losses[2], rel=1e-5, abs=1e-7)


def test_resume_never_refuses_to_overwrite_a_run_with_checkpoints(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "latest").write_text("iter_000001")
    proc = run_cli(["train", f"trainer.output_dir={tmp_path}", "trainer.run_name=run", "trainer.resume=never"])
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "trainer.resume=never" in out and "Traceback" not in out
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoints"]  # nothing written


def test_gpu_recipe_without_gpu_is_refused_before_anything_is_written(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_cli(["train", "recipe=alfworld_bipace_qwen7b", f"trainer.output_dir={tmp_path}"])
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "needs GPUs" in out and "*_tiny" in out
    assert list(tmp_path.iterdir()) == []


def test_two_ranks_broadcast_their_weights_to_the_rollout_workers(tmp_path, start_model):
    """rollout.weight_sync=broadcast: the learner's rank 0 (a Ray actor here) and the rollout worker
    form a group of their own (gloo on CPU, NCCL on GPUs); iteration 2 samples with the weights it
    broadcast after iteration 1, so the rollout's log-probs are the learner's."""
    args = [a for a in train_args(tmp_path / "out", start_model) if not a.startswith("trainer.save_every")]
    proc = run_cli([*args, "rollout.weight_sync=broadcast", "trainer.save_every=0"])
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    records = read_metrics(tmp_path / "out" / "run" / "metrics.jsonl")
    iteration_2 = next(r for r in records if r.get("step") == 2 and "learner/loss" in r)
    assert iteration_2["learner/rollout_logprob_gap_max"] < 1e-3
    assert iteration_2["time/sync_s"] > 0
