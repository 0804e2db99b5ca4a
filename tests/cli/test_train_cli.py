"""`agentrl train` end to end through the real CLI: Ray rollout workers and env pool actors,
DeepSpeed with 2 learner ranks, the weights broadcast to the rollout worker, tracking, checkpoints,
and a run killed after iteration 1 and resumed, which must reproduce the uninterrupted run's
iteration-2 loss. The runs join the session's Ray head (tests/conftest.py::ray_head)."""

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.runs.tracking import read_metrics
from cli_train import TINY, iteration_losses, kill_after_first_checkpoint, run_cli, train_args  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def start_model(tiny_start_model):
    """The session's tiny starting policy."""
    return tiny_start_model


def test_train_two_ranks_then_kill_and_resume(tmp_path, start_model, two_rank_run, ray_head):
    """The uninterrupted run (tests/conftest.py::two_rank_run) syncs with rollout.weight_sync=broadcast:
    the learner's rank 0 (a Ray actor here) and the rollout worker form a group of their own (gloo on
    CPU, NCCL on GPUs); iteration 2 samples with the weights it broadcast after iteration 1, so the
    rollout's log-probs are the learner's. The killed and resumed run syncs the default way (packed
    buckets through Ray's object store) and must give the same iteration-2 loss."""
    out = two_rank_run.output
    assert two_rank_run.returncode == 0, out[-3000:]
    run_dir = two_rank_run.run_dir
    records = read_metrics(run_dir / "metrics.jsonl")
    losses = iteration_losses(run_dir)
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
    iteration_2 = next(r for r in records if r.get("step") == 2 and "learner/loss" in r)
    for key in ("rollout/success_rate", "rollout/invalid_action_rate", "learner/grad_norm", "learner/pg_clipfrac",
                "learner/kl_ref", "learner/entropy", "estimator/num_groups", "time/rollout_s", "time/update_s",
                "time/rollout_generate_s", "time/rollout_env_s", "rollout/generated_tokens"):
        assert key in iteration_2, key
    assert any("val/success_rate" in r for r in records)
    # iteration 2 sampled with the weights broadcast after iteration 1's update: the rollout backend's
    # log-probs of its tokens match the learner's (both fp32 on CPU)
    assert iteration_2["learner/rollout_logprob_gap_max"] < 1e-3
    assert iteration_2["time/sync_s"] > 0
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
    kill_after_first_checkpoint(run_cli(train_args(tmp_path / "killed", start_model), extra_env=ray_head),
                                tmp_path / "killed" / "run")
    resumed = run_cli(train_args(tmp_path / "killed", start_model), extra_env=ray_head)
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out[-3000:]
    assert "resumed run after iteration 1" in out
    resumed_losses = iteration_losses(tmp_path / "killed" / "run")
    assert resumed_losses[2] == pytest.approx(losses[2], rel=1e-5, abs=1e-7)
    # the default sync also gave iteration 2's rollout the learner's weights
    resumed_2 = next(r for r in read_metrics(tmp_path / "killed" / "run" / "metrics.jsonl")
                     if r.get("step") == 2 and "learner/loss" in r)
    assert resumed_2["learner/rollout_logprob_gap_max"] < 1e-3


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
