"""One `Trainer.iteration` with the real learner on a recorded rollout: which rows the learner's
log-prob pass scores (only the rows the update trains on, unless the estimator is BiPACE and the
rollout brought no hidden states: then all of them, before the estimator, with hidden states)."""

import time

import pytest
import torch

from agentrl.data import StepBatch
from agentrl.envs import TaskRef
from agentrl.learner.engine import Learner
from agentrl.rollout.engine import EpisodeResult, RolloutResult
from agentrl.rollout.sources import RolloutSource, Taken
from agentrl.training.inspection import BatchRecorder
from agentrl.training.trainer import Trainer
from agentrl.weights import PackedPath, WeightPath
from tiny_setup import learner_config, write_tiny_model


class RecordedRollout(RolloutSource):
    """Hands back one recorded rollout; stands in for the Ray rollout workers behind the sync source
    (and says in which order the trainer called it, in ``events``, shared with the learner below)."""

    def __init__(self, result: RolloutResult, events: list):
        self.result, self.events = result, events

    def next_batch(self, iteration):
        self.events.append("rollout")
        return Taken(self.result)

    def sleep(self):
        self.events.append("sleep")
        time.sleep(0.01)


class RecordedWeights(WeightPath):
    """Records the weight pushes (the packed path's learner side runs for real)."""

    def __init__(self, learner, events: list):
        super().__init__(learner, None)
        self.events = events

    def push(self, version):
        self.learner.weights_call(PackedPath.Sender, "pack")
        self.events.append("load_weights")
        self.version = version


class CountingLearner:
    """The real learner, counting the rows each log-prob pass scores."""

    def __init__(self, learner: Learner, events: list):
        self.learner, self.passes, self.events = learner, [], events

    def compute_logprobs(self, batch, hidden_layer=None):
        self.events.append("pass")
        self.passes.append((len(batch), hidden_layer))
        return self.learner.compute_logprobs(batch, hidden_layer)

    def update(self, batch, options=None, version=None):
        self.events.append("update")
        return self.learner.update(batch, options, version)

    def __getattr__(self, name):
        return getattr(self.learner, name)


def recorded_rollout() -> RolloutResult:
    """Group 0: both episodes fail (advantage 0 everywhere); group 1: one win, one loss. 7 rows."""
    g = torch.Generator().manual_seed(0)
    records, outcomes = [], []
    for group, traj, steps, won in ((0, 0, 2, False), (0, 1, 2, False), (1, 2, 1, True), (1, 3, 2, False)):
        outcomes.append(EpisodeResult(group_id=group, traj_id=traj, task=TaskRef("train", group), task_type="t",
                                      won=won, episode_return=float(won), length=steps, invalid_actions=0))
        for step in range(steps):
            done = step == steps - 1
            records.append(dict(group_id=group, traj_id=traj, step=step, done=done, success=won and done,
                                reward=10.0 if won and done else 0.0, anchor_obs=f"obs {traj} {step}",
                                prompt_ids=torch.randint(10, 300, (6,), generator=g).tolist(),
                                response_ids=torch.randint(10, 300, (3,), generator=g).tolist(),
                                response_mask=[1.0, 1.0, 1.0]))
    return RolloutResult(batch=StepBatch.from_records(records, pad_id=1), episodes=outcomes)


@pytest.mark.parametrize("estimator, recorded_hidden, rows_scored, hidden_layer", [
    ("grpo", False, 3, None), ("bipace", False, 7, 1), ("bipace", True, 3, None)])
def test_learner_pass_scores_the_trained_rows_unless_hidden_states_are_missing(
        tmp_path, estimator, recorded_hidden, rows_scored, hidden_layer):
    cfg = learner_config(skip_zero_advantage=True, mini_batch_size=8)
    cfg.algorithm.estimator = estimator
    cfg.algorithm.grpo.norm_by_std = False
    cfg.algorithm.bipace.hidden_layer = 1
    cfg.trainer.output_dir = str(tmp_path / "runs")
    cfg.logging.tensorboard, cfg.logging.progress_bar, cfg.logging.wandb.mode = False, False, "disabled"
    trainer = Trainer(cfg, "unit")
    try:
        learner = Learner(cfg, write_tiny_model(tmp_path / "model"))
        rollout = recorded_rollout()
        if recorded_hidden:     # what the torch backend's prefill records (tests/generation/test_torch_backend.py)
            hidden = learner.compute_logprobs(rollout.batch, hidden_layer=1).hidden
            rollout.batch = rollout.batch.with_columns(hidden=hidden)
        events = []
        trainer.learner = CountingLearner(learner, events)
        trainer.source = RecordedRollout(rollout, events)
        trainer.weights = RecordedWeights(learner, events)
        trainer.recorder = BatchRecorder(cfg, trainer.run, "unused: no batches saved")
        trainer.estimator_state = trainer.estimator.new_state()
        metrics = trainer.iteration(1)
    finally:
        trainer.tracker.close()
    assert trainer.learner.passes == [(rows_scored, hidden_layer)]
    assert trainer.weights.version == 1      # the weights after iteration 1's update are policy version 1
    assert trainer.finished == 1
    # a colocated rollout engine sleeps right after the rollout, before any learner pass, and the weight
    # sync after the update wakes it
    assert events == ["rollout", "sleep", "pass", "update", "load_weights"]
    assert 0.0 <= metrics["time/sleep_s"] < metrics["time/iteration_s"]
    assert metrics["learner/optimizer_steps"] == 1.0 and metrics["time/learner_pass_s"] > 0
    # the recorded rollout reports log-probs of 0, so the gap is the learner's own -log p of those tokens
    assert metrics["learner/rollout_logprob_gap_max"] >= metrics["learner/rollout_logprob_gap_mean"] > 1.0
    if rows_scored == 3:        # group 1's three rows: the all-failed group 0 is left out before the pass
        assert metrics["learner/trained_row_fraction"] == pytest.approx(3 / 7)


def test_trainer_warns_when_its_in_process_cpu_learner_keeps_denormals(tmp_path):
    """The pytest process keeps IEEE floats (tests/conftest.py), as a user's script does before it
    calls agentrl.runtime.denormals.flush_denormals(): a one-rank CPU learner, which runs in this process,
    gets the warning with the fix; Ray learner ranks flush their own threads, so two ranks get none."""
    import warnings

    from agentrl.training.cpu_cores import prepare_local_learner

    cfg = learner_config()
    cfg.trainer.output_dir = str(tmp_path / "runs")
    cfg.logging.tensorboard, cfg.logging.progress_bar, cfg.logging.wandb.mode = False, False, "disabled"
    trainer = Trainer(cfg, "unit")
    try:
        assert trainer.learner_device() == "cpu"
        cfg.learner.num_ranks = 1
        with pytest.warns(RuntimeWarning, match="flush_denormals"):
            assert prepare_local_learner(cfg, trainer.learner_device())
        cfg.learner.num_ranks = 2
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert not prepare_local_learner(cfg, trainer.learner_device())
    finally:
        trainer.tracker.close()
