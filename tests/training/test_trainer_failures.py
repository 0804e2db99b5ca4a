"""A failed iteration stops the run cleanly with the right checkpoint (agentrl.training.failures),
through the real trainer loop and the real learner, the rollout source standing in for the workers:

* a rollout failure after the update (one_step_off waits for the call in flight between the update
  and the weight push) saves *that* iteration: the learner already holds its update, and a resumed
  run must not train it again;
* a failure while a checkpoint waits for the next iteration's groups is a clean stop with that
  iteration saved, not a traceback."""

from __future__ import annotations

import json

import pytest

from agentrl.errors import UsageError
from agentrl.learner.engine import Learner
from agentrl.rollout.engine import EnvFailureLimitError
from agentrl.rollout.sources import RolloutSource, Taken
from agentrl.rollout.worker_calls import RolloutHangError
from agentrl.training.inspection import BatchRecorder
from agentrl.training.trainer import Trainer
from test_trainer_iteration import RecordedWeights, recorded_rollout
from tiny_setup import learner_config, write_tiny_model


class FailingSource(RolloutSource):
    """Gives the recorded rollout every iteration; raises ``error`` from ``where`` in iteration ``at``."""

    def __init__(self, where: str, at: int, error: Exception):
        self.where, self.at, self.error = where, at, error
        self.iteration = 0
        self.saved = []

    def next_batch(self, iteration):
        self.iteration = iteration
        return Taken(recorded_rollout())

    def before_push(self):
        if self.where == "before_push" and self.iteration == self.at:
            raise self.error

    def wait_for_next(self):
        if self.where == "wait_for_next" and self.iteration == self.at:
            raise self.error

    def save(self, directory):
        directory.mkdir(parents=True)
        self.saved.append(self.iteration)


def run_until_it_fails(tmp_path, source: FailingSource, save_every: int) -> tuple[Trainer, str]:
    cfg = learner_config(mini_batch_size=8)
    cfg.trainer.output_dir, cfg.trainer.iterations, cfg.trainer.save_every = str(tmp_path / "runs"), 3, save_every
    cfg.trainer.eval_every = 0
    cfg.logging.tensorboard, cfg.logging.progress_bar, cfg.logging.wandb.mode = False, False, "disabled"
    trainer = Trainer(cfg, "unit")
    try:
        learner = Learner(cfg, write_tiny_model(tmp_path / "model"))
        trainer.learner, trainer.source = learner, source
        trainer.weights = RecordedWeights(learner, [])
        trainer.recorder = BatchRecorder(cfg, trainer.run, "unused: no batches saved")
        trainer.estimator_state = trainer.estimator.new_state()
        with pytest.raises(UsageError) as stopped:
            trainer.loop(1)
    finally:
        trainer.tracker.close()
    return trainer, str(stopped.value)


def saved_iteration(trainer: Trainer) -> int:
    latest = (trainer.run.checkpoints / "latest").read_text().strip()
    return json.loads((trainer.run.checkpoints / latest / "trainer_state.json").read_text())["iteration"]


def test_a_rollout_failure_after_the_update_saves_that_iteration(tmp_path):
    source = FailingSource("before_push", 2, EnvFailureLimitError("17 textcraft episodes failed in one rollout"))
    trainer, message = run_until_it_fails(tmp_path, source, save_every=0)
    assert "training stopped in iteration 2: 17 textcraft episodes failed" in message
    assert "holds iteration 2" in message
    # the learner made 2 updates: the checkpoint that holds them says iteration 2, so a resumed run
    # starts at iteration 3 (saving it as iteration 1 would train iteration 2 twice)
    assert trainer.learner.update_calls == 2 and saved_iteration(trainer) == 2 and source.saved == [2]


def test_a_failure_while_a_checkpoint_waits_for_the_next_groups_is_a_clean_stop(tmp_path):
    source = FailingSource("wait_for_next", 1, RolloutHangError("rollout worker 0 made no progress for 601 s"))
    trainer, message = run_until_it_fails(tmp_path, source, save_every=1)
    assert message.startswith("training stopped in iteration 1: rollout worker 0 made no progress")
    assert "holds iteration 1" in message and "rollout workers are healthy" in message
    assert trainer.learner.update_calls == 1 and saved_iteration(trainer) == 1 and source.saved == [1]
