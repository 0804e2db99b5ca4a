"""A full disk at checkpoint time: the torn write is removed, `latest` keeps naming the last complete
checkpoint, the run is told why and how to fix it, and the trainer goes on training. Before writing,
a checkpoint the size of the last one that does not fit makes the run prune early what the
keep-count would prune after the write, and refuse only if that is still not enough."""

import errno
import json
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from agentrl.learner.engine import Learner
from agentrl.runs.directory import CheckpointNotWritten, RunDirectory, TrainerState, directory_bytes
from agentrl.rollout.sources import RolloutSource
from agentrl.training.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "learner"))
from tiny_setup import learner_config, step_batch, write_tiny_model  # noqa: E402

Usage = namedtuple("Usage", "total used free")


class DiskFillsWhileSaving:
    """The real learner, whose next checkpoint writes its files and then meets a full disk."""

    def __init__(self, learner: Learner):
        self.learner = learner

    def save_checkpoint(self, directory):
        self.learner.save_checkpoint(directory)
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    learner = Learner(learner_config(), write_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))
    learner.update(learner.compute_logprobs(step_batch()))
    return learner


def run_directory(tmp_path, keep: int = 2) -> RunDirectory:
    cfg = learner_config()
    cfg.trainer.output_dir, cfg.trainer.run_name, cfg.trainer.keep_checkpoints = str(tmp_path), "run", keep
    return RunDirectory.create(cfg, None)


def names(run: RunDirectory) -> list[str]:
    return sorted(p.name for p in run.checkpoints.iterdir())


def test_disk_full_while_writing_keeps_the_last_checkpoint(tmp_path, learner):
    run = run_directory(tmp_path)
    run.save(TrainerState(iteration=1), learner)
    with pytest.raises(CheckpointNotWritten) as err:
        run.save(TrainerState(iteration=2), DiskFillsWhileSaving(learner))
    message = str(err.value)
    assert "iter_000002 not written" in message and "No space left on device" in message
    assert "iter_000001 is intact" in message and "trainer.keep_checkpoints" in message
    assert names(run) == ["iter_000001", "latest"]  # the torn iter_000002.partial is gone
    assert run.load_latest().iteration == 1
    run.save(TrainerState(iteration=2), learner)    # space again: the next save is a normal one
    assert names(run) == ["iter_000001", "iter_000002", "latest"]


def test_too_little_space_prunes_early_then_refuses_before_writing(tmp_path, learner, monkeypatch):
    run = run_directory(tmp_path)
    run.save(TrainerState(iteration=1), learner)
    run.save(TrainerState(iteration=2), learner)
    size = directory_bytes(run.checkpoint_dir(2))
    capacity = [2.5 * size]     # a disk that holds two and a half checkpoints (what is written counts)

    def disk_usage(path):
        used = directory_bytes(run.checkpoints)
        return Usage(int(capacity[0]), used, int(capacity[0] - used))

    monkeypatch.setattr("agentrl.runs.directory.shutil.disk_usage", disk_usage)
    # two checkpoints leave half of one free: iter_000001, which keep=2 drops after the write
    # anyway, goes first; then iteration 3 fits
    run.save(TrainerState(iteration=3), learner)
    assert names(run) == ["iter_000002", "iter_000003", "latest"]
    # a disk for one and a half: after iter_000002 goes early, half of one is free, and the newest
    # complete checkpoint is never pruned to make room, so iteration 4 is refused before writing
    capacity[0] = 1.5 * size
    with pytest.raises(CheckpointNotWritten, match="GB are free"):
        run.save(TrainerState(iteration=4), learner)
    assert names(run) == ["iter_000003", "latest"]
    assert (run.checkpoints / "latest").read_text() == "iter_000003"


def test_trainer_warns_and_trains_on_when_a_checkpoint_cannot_be_written(tmp_path, learner, capsys):
    cfg = learner_config()
    cfg.trainer.output_dir = str(tmp_path / "runs")
    cfg.logging.tensorboard, cfg.logging.progress_bar, cfg.logging.wandb.mode = False, False, "disabled"
    trainer = Trainer(cfg, "unit")
    try:
        trainer.learner, trainer.source = learner, RolloutSource()
        assert trainer.checkpoint(1) == trainer.run.checkpoint_dir(1)
        trainer.learner = DiskFillsWhileSaving(learner)
        assert trainer.checkpoint(2) is None    # no exception: training goes on
    finally:
        trainer.tracker.close()
    assert "agentrl: warning: checkpoint iter_000002 not written" in capsys.readouterr().err
    records = [json.loads(line) for line in (trainer.run.path / "metrics.jsonl").read_text().splitlines()]
    assert {"step": 2, "checkpoint/not_written": 1.0}.items() <= next(r for r in records if "checkpoint/not_written" in r).items()
    assert (trainer.run.checkpoints / "latest").read_text() == "iter_000001"
