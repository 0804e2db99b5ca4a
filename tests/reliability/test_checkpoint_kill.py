"""Kill during a checkpoint save: the previous checkpoint stays the one `latest` points at, it
loads, and the next save cleans the torn directory up. Also: non-finite numbers never reach the
optimizer through the real learner (NaN/inf in log-probs, all-invalid and constant-reward batches)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from agentrl.estimators import compute_advantages, registered_names
from agentrl.learner.engine import Learner
from agentrl.runs.directory import RunDirectory, TrainerState

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "learner"))
from tiny_setup import learner_config, step_batch, write_tiny_model  # noqa: E402

CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {learner_tests!r})
    from tiny_setup import learner_config, step_batch
    from agentrl.learner.engine import Learner
    from agentrl.runs.directory import RunDirectory, TrainerState

    cfg = learner_config()
    cfg.trainer.output_dir, cfg.trainer.run_name = {out!r}, "run"
    run = RunDirectory.create(cfg, None)
    learner = Learner(cfg, {model!r})
    learner.update(learner.compute_logprobs(step_batch()))
    run.save(TrainerState(iteration=1, model_dir={model!r}), learner)
    learner.update(learner.compute_logprobs(step_batch(seed=1)))
    original = learner.save_checkpoint

    def save_then_die(directory):
        original(directory)                     # the learner files of iteration 2 are on disk ...
        os.kill(os.getpid(), signal.SIGKILL)    # ... and the process dies before the rename

    learner.save_checkpoint = save_then_die
    run.save(TrainerState(iteration=2, model_dir={model!r}), learner)
""")


def test_kill_inside_save_leaves_the_previous_checkpoint_usable(tmp_path):
    model = write_tiny_model(tmp_path / "model")
    out = tmp_path / "runs"
    script = CHILD.format(learner_tests=str(Path(__file__).resolve().parent.parent / "helpers"), out=str(out),
                          model=model)
    # a learner created earlier in this test process left its rendezvous variables in os.environ
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]  # SIGKILL, as injected
    checkpoints = out / "run" / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "iter_000001"
    assert (checkpoints / "iter_000002.partial" / "learner").is_dir()  # the torn save is left aside
    assert not (checkpoints / "iter_000002").exists()

    cfg = learner_config()
    cfg.trainer.output_dir, cfg.trainer.run_name = str(out), "run"
    run = RunDirectory.create(cfg, None)
    state = run.load_latest()
    assert state.iteration == 1
    learner = Learner(cfg, model)
    learner.load_checkpoint(str(run.learner_checkpoint(1)))
    metrics = learner.update(learner.compute_logprobs(step_batch(seed=1)))
    assert metrics["optimizer_steps"] >= 1 and torch.isfinite(torch.tensor(metrics["loss"]))
    run.save(TrainerState(iteration=2, model_dir=model), learner)  # the retry replaces the torn directory
    assert sorted(p.name for p in checkpoints.iterdir()) == ["iter_000001", "iter_000002", "latest"]
    assert json.loads((checkpoints / "iter_000002" / "trainer_state.json").read_text())["iteration"] == 2


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in learner.state_dict_for_rollout().items()}


def test_non_finite_numbers_never_reach_the_optimizer(tmp_path):
    learner = Learner(learner_config(), write_tiny_model(tmp_path / "model"))
    batch = learner.compute_logprobs(step_batch())
    before = _weights(learner)
    for column, value in (("old_logprobs", float("nan")), ("ref_logprobs", float("inf"))):
        poisoned = getattr(batch, column).clone()
        poisoned[0, 0] = value
        metrics = learner.update(batch.with_columns(**{column: poisoned}))
        assert metrics["skipped_steps"] >= 1 and metrics["optimizer_steps"] == 0, column
    assert all(torch.equal(before[k], v) for k, v in learner.state_dict_for_rollout().items())

    # all-invalid responses with constant rewards: every estimator gives finite (zero) advantages
    invalid = batch.with_columns(action_valid=torch.zeros(len(batch), dtype=torch.bool),
                                 env_reward=torch.zeros(len(batch)), invalid_penalty=torch.full((len(batch),), 0.1),
                                 success=torch.zeros(len(batch), dtype=torch.bool),
                                 episode_return=torch.full((len(batch),), -0.1),
                                 hidden=torch.randn(len(batch), 8))
    for name in registered_names():
        advantages, _ = compute_advantages(name, invalid)
        assert torch.isfinite(advantages).all(), name
        metrics = learner.update(invalid.with_columns(advantages=advantages))
        assert torch.isfinite(torch.tensor(metrics["loss"])), name
