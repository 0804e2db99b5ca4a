"""Checkpoints after a power loss: every file and directory of a checkpoint is flushed to disk before
its commit marker, the marker before the rename, the rename before ``latest``; a resumed run that
finds the latest checkpoint incomplete (files shorter than written, zero-length, an empty ``latest``)
falls back to the newest complete one with one warning line, and the real learner loads it."""

import json
import os
from pathlib import Path

import pytest

from agentrl.errors import UsageError
from agentrl.learner.engine import Learner
from agentrl.runs import directory as run_directory_module
from agentrl.runs.directory import COMMIT_MARKER, RunDirectory, TrainerState, checkpoint_problem
from reliability_kit import record_figures
from tiny_setup import learner_config, step_batch, write_tiny_model


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    learner = Learner(learner_config(), write_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))
    learner.update(learner.compute_logprobs(step_batch()))
    return learner


def run_directory(tmp_path, resume: str = "auto") -> RunDirectory:
    cfg = learner_config()
    cfg.trainer.output_dir, cfg.trainer.run_name, cfg.trainer.keep_checkpoints = str(tmp_path), "run", 3
    cfg.trainer.resume = resume
    return RunDirectory.create(cfg, None)


def saved_twice(tmp_path, learner) -> RunDirectory:
    run = run_directory(tmp_path)
    run.save(TrainerState(iteration=1), learner)
    learner.update(learner.compute_logprobs(step_batch(seed=1)))
    run.save(TrainerState(iteration=2), learner)
    return run


def biggest_learner_file(checkpoint: Path) -> Path:
    return max((p for p in (checkpoint / "learner").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def test_files_reach_the_disk_before_the_marker_the_rename_and_latest(tmp_path, learner, monkeypatch):
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def recording_replace(src, dst):
        events.append(("rename", f"{src} -> {dst}"))
        return replace(src, dst)

    monkeypatch.setattr(run_directory_module.os, "fsync", recording_fsync)
    monkeypatch.setattr(run_directory_module.os, "replace", recording_replace)
    run = run_directory(tmp_path)
    final = run.save(TrainerState(iteration=1), learner)
    partial = str(final) + ".partial"
    rename_at = events.index(("rename", f"{partial} -> {final}"))
    synced_before = {path for kind, path in events[:rename_at] if kind == "fsync"}
    written = [str(p).replace(str(final), partial) for p in final.rglob("*")]
    assert written and set(written) <= synced_before | {f"{partial}/{COMMIT_MARKER}"}
    marker_at = events.index(("rename", f"{partial}/{COMMIT_MARKER}.tmp -> {partial}/{COMMIT_MARKER}"))
    assert marker_at < rename_at and ("fsync", partial) in events[marker_at:rename_at]   # the marker, last
    latest = str(run.checkpoints / "latest")
    latest_at = events.index(("rename", f"{latest}.tmp -> {latest}"))
    assert ("fsync", str(run.checkpoints)) in events[rename_at:latest_at]            # the rename is durable
    assert events[latest_at - 1] == ("fsync", f"{latest}.tmp") and events[-1] == ("fsync", str(run.checkpoints))
    files = json.loads((final / COMMIT_MARKER).read_text())["files"]
    assert "trainer_state.json" in files and any(name.startswith("learner/") for name in files)
    assert checkpoint_problem(final) is None


@pytest.mark.parametrize("damage", ["truncated", "zero-length", "missing", "empty latest", "marker lost"])
def test_an_incomplete_latest_checkpoint_falls_back_to_the_newest_complete_one(tmp_path, learner, capsys, damage):
    run = saved_twice(tmp_path, learner)
    newest = run.checkpoint_dir(2)
    victim = biggest_learner_file(newest)
    size = victim.stat().st_size
    if damage == "truncated":
        os.truncate(victim, size // 3)
    elif damage == "zero-length":
        os.truncate(victim, 0)
    elif damage == "missing":
        victim.unlink()
    elif damage == "empty latest":
        (run.checkpoints / "latest").write_text("")
    else:
        (newest / COMMIT_MARKER).write_text('{"files": {"learner/')
    state = run_directory(tmp_path).load_latest()
    err = capsys.readouterr().err.strip()
    expected = 2 if damage == "empty latest" else 1        # an empty pointer: the newest complete one is iter 2
    assert state.iteration == expected
    assert len(err.splitlines()) == 1 and err.startswith("agentrl: warning:")
    assert f"resuming from iter_00000{expected}, the newest complete checkpoint" in err
    what = {"truncated": f"has {size // 3} bytes, {size} were written", "zero-length": f"has 0 bytes, {size} were",
            "missing": "is missing", "empty latest": "checkpoints/latest is empty",
            "marker lost": "commit marker is unreadable"}[damage]
    assert what in err and (damage in ("empty latest", "marker lost") or victim.name in err), err
    if damage == "truncated":   # the real learner loads the fallback and trains on
        learner.load_checkpoint(str(run.learner_checkpoint(state.iteration)))
        learner.update(learner.compute_logprobs(step_batch(seed=2)))
        record_figures("checkpoint truncated after a power loss", faults_injected=1, fallback=f"iter {expected}",
                       checkpoints_lost=1, iterations_lost=1)


def test_no_complete_checkpoint_or_an_incomplete_one_named_stops_in_one_line(tmp_path, learner):
    run = saved_twice(tmp_path, learner)
    for iteration in (1, 2):
        os.truncate(biggest_learner_file(run.checkpoint_dir(iteration)), 0)
    with pytest.raises(UsageError, match="no complete checkpoint to resume from .*iter_000002: learner/.* has 0 "
                                         "bytes.*iter_000001: .*move that directory aside"):
        run_directory(tmp_path).load_latest()
    with pytest.raises(UsageError, match="cannot resume from .*iter_000001: it is incomplete"):
        run_directory(tmp_path, resume=str(run.checkpoint_dir(1))).load_latest()


def test_a_checkpoint_written_before_markers_is_judged_by_its_trainer_state(tmp_path, learner):
    run = saved_twice(tmp_path, learner)
    (run.checkpoint_dir(2) / COMMIT_MARKER).unlink()
    assert checkpoint_problem(run.checkpoint_dir(2)) is None
    assert run_directory(tmp_path).load_latest().iteration == 2
    (run.checkpoint_dir(2) / "trainer_state.json").write_text("{")
    assert "trainer_state.json is unreadable" in checkpoint_problem(run.checkpoint_dir(2))
