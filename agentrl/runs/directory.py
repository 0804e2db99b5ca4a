"""A run's directory: its config, checkpoints, and what a resumed run needs to go on.

Layout of ``<trainer.output_dir>/<run name>/``::

    config.yaml                 the resolved config of the first start
    metrics.jsonl, tensorboard/ tracking
    init_model/, sft_model/     the starting policy (tiny recipes)
    checkpoints/iter_000010/    learner/ (model, optimizer, RNG) + trainer_state.json
                                (+ rollout_buffer/ with trainer.mode one_step_off or async)
    checkpoints/latest          name of the newest complete checkpoint
    final_model/                the trained policy as a Hugging Face directory

A checkpoint is written to ``iter_N.partial``; every file and directory in it is flushed to disk
(fsync), then its commit marker ``COMMITTED.json`` (each file's size) is written and flushed last, the
directory is renamed ``iter_N`` and ``latest`` replaced atomically, each rename flushed too. A kill
at any moment leaves the previous checkpoint usable, and so does a power loss: resuming checks the
checkpoint ``latest`` names against its marker and falls back, with a one-line warning, to the
newest complete one when it is incomplete or unreadable (a file shorter than written, a lost marker
or pointer).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from agentrl.config import Config, config_to_yaml
from agentrl.errors import UsageError


@dataclasses.dataclass
class TrainerState:
    iteration: int = 0
    model_dir: str | None = None          # the starting policy the learner was built from
    estimator_state: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "TrainerState":
        data = json.loads(text)
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls) if f.name in data})


COMMIT_MARKER = "COMMITTED.json"     # written last into a checkpoint: its files and their sizes


def _fsync(path: Path) -> None:
    """Flush a file's or a directory's contents to disk (directories: their entries, i.e. renames)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY)
    except OSError:
        if path.is_dir() and os.name == "nt":     # Windows cannot open a directory to flush it
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str, durable: bool = False) -> None:
    """``text`` into ``path`` by a rename, so a reader sees the old or the new text; ``durable``: flushed
    to disk first, and the rename after it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        _fsync(path.parent)


def commit(directory: Path, iteration: int) -> None:
    """Flush every file and directory of a written checkpoint, then write its marker (flushed, last)."""
    files: dict[str, int] = {}
    for path in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):  # deepest first
        _fsync(path)
        if path.is_file():
            files[path.relative_to(directory).as_posix()] = path.stat().st_size
    _write_atomically(directory / COMMIT_MARKER, json.dumps({"iteration": iteration, "files": files}, indent=1,
                                                            sort_keys=True), durable=True)


def checkpoint_problem(directory: Path) -> str | None:
    """What is wrong with the checkpoint in ``directory`` (None when it is complete): a file its marker
    lists that is missing or has another size, an unreadable marker or trainer state. A checkpoint
    written before markers existed is judged by its trainer state alone."""
    if not directory.is_dir():
        return "it does not exist"
    marker = directory / COMMIT_MARKER
    if marker.exists():
        try:
            files = json.loads(marker.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            return f"its commit marker is unreadable ({type(err).__name__})"
        for name, size in files.items():
            path = directory / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size} bytes, {size} were written"
    try:
        TrainerState.from_json((directory / "trainer_state.json").read_text())
    except (OSError, ValueError, TypeError) as err:
        return f"trainer_state.json is unreadable ({type(err).__name__})"
    return None


class RunDirectory:
    def __init__(self, path: Path, cfg: Config):
        self.path = path
        self.name = path.name
        self.cfg = cfg
        self.checkpoints = path / "checkpoints"

    @classmethod
    def create(cls, cfg: Config, recipe: str | None) -> "RunDirectory":
        name = cfg.trainer.run_name or f"{Path(recipe).stem if recipe else 'default'}-seed{cfg.trainer.seed}"
        # absolute: a learner rank (a Ray actor) runs in the directory its node's `ray start` ran in
        path = Path(cfg.trainer.output_dir).expanduser().absolute() / name
        run = cls(path, cfg)
        has_checkpoint = (run.checkpoints / "latest").is_file()
        if has_checkpoint and cfg.trainer.resume == "never":
            raise UsageError(f"run directory {path} already holds checkpoints and trainer.resume=never; choose "
                             "another trainer.run_name, or resume it with trainer.resume=auto")
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as err:
            raise UsageError(f"cannot write to the run directory {path} ({err.strerror}); set trainer.output_dir "
                             "to a writable directory") from None
        config_file = path / "config.yaml"
        if not config_file.exists():
            _write_atomically(config_file, config_to_yaml(cfg))
        return run

    # ----- validation ----------------------------------------------------------------------------
    def validation_file(self, iteration: int) -> Path:
        return self.path / "validation" / f"iter_{iteration:06d}.jsonl"

    def write_validation(self, iteration: int, episodes_by_seed: dict[int, list]) -> Path:
        """Every validation episode of ``iteration`` (per sampling seed), one JSON line each: what a
        paired comparison of two runs on the same layouts reads (``agentrl bench parity``)."""
        path = self.validation_file(iteration)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"seed": seed, "task": e.task.to_dict(), "task_type": e.task_type, "won": bool(e.won),
                             "return": e.episode_return, "length": e.length})
                 for seed, episodes in episodes_by_seed.items() for e in episodes]
        _write_atomically(path, "\n".join(lines) + "\n")
        return path

    # ----- checkpoints ---------------------------------------------------------------------------
    def checkpoint_dir(self, iteration: int) -> Path:
        return self.checkpoints / f"iter_{iteration:06d}"

    def learner_checkpoint(self, iteration: int) -> Path:
        return self.checkpoint_dir(iteration) / "learner"

    def load_latest(self) -> TrainerState | None:
        """The state of the checkpoint to resume from (``trainer.resume``), or None to start fresh. With
        ``auto``: the one ``latest`` names, else (incomplete or unreadable, said in one warning line) the
        newest complete one."""
        resume = self.cfg.trainer.resume
        if resume == "never":
            return None
        if resume == "auto":
            pointer = self.checkpoints / "latest"
            if not pointer.is_file():
                return None
            directory = self._complete_latest(pointer)
        else:
            directory = Path(resume).expanduser()
            if not (directory / "trainer_state.json").is_file():
                raise UsageError(f"cannot resume from {directory}: it has no trainer_state.json (not a complete "
                                 "agentrl checkpoint); pass trainer.resume=auto or a checkpoints/iter_N directory")
            problem = checkpoint_problem(directory)
            if problem is not None:
                raise UsageError(f"cannot resume from {directory}: it is incomplete ({problem}); pass another "
                                 "checkpoints/iter_N directory or trainer.resume=auto")
        state = TrainerState.from_json((directory / "trainer_state.json").read_text())
        if directory.parent != self.checkpoints:  # resuming another run's checkpoint: copy it in first
            self.checkpoints.mkdir(parents=True, exist_ok=True)
            shutil.copytree(directory, self.checkpoint_dir(state.iteration), dirs_exist_ok=True)
        return state

    def _complete_latest(self, pointer: Path) -> Path:
        """The checkpoint ``latest`` names when it is complete, else the newest complete one (a warning
        says which and why); a UsageError when none is."""
        try:
            named = pointer.read_text().strip()
        except OSError:
            named = ""
        problems = []
        if named:
            problem = checkpoint_problem(self.checkpoints / named)
            if problem is None:
                return self.checkpoints / named
            problems.append(f"{named}: {problem}")
        else:
            problems.append("checkpoints/latest is empty")
        for directory in reversed(self.complete_checkpoints()):
            if directory.name == named:
                continue
            problem = checkpoint_problem(directory)
            if problem is None:
                print(f"agentrl: warning: {problems[0]}; resuming from {directory.name}, the newest complete "
                      "checkpoint", file=sys.stderr, flush=True)
                return directory
            problems.append(f"{directory.name}: {problem}")
        raise UsageError(f"no complete checkpoint to resume from in {self.checkpoints} ({'; '.join(problems)}); "
                         "move that directory aside to start afresh, or pass trainer.resume=never with another "
                         "trainer.run_name")

    def save(self, state: TrainerState, learner, extra: Callable[[Path], None] | None = None) -> Path:
        """Write a complete checkpoint for ``state.iteration`` and point ``latest`` at it (``extra``
        writes more into the checkpoint's directory before it is complete, e.g. the rollout buffer).

        When the disk cannot hold it (judged from the newest checkpoint's size before writing, or an
        ENOSPC/EDQUOT while writing), the checkpoints that the keep-count would prune after this
        one are pruned first; if that is not enough, nothing is pointed at the torn write, it is
        removed, and :class:`CheckpointNotWritten` says why: ``latest`` still names the previous
        complete checkpoint, so the run loses nothing it had saved.
        """
        final = self.checkpoint_dir(state.iteration)
        partial = final.with_name(final.name + ".partial")
        if partial.exists():
            shutil.rmtree(partial)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self._make_room(final.name)
        try:
            partial.mkdir()
            learner.save_checkpoint(str(partial / "learner"))
            if extra is not None:
                extra(partial)
            (partial / "trainer_state.json").write_text(state.to_json())
            commit(partial, state.iteration)        # on disk, then the marker: before any rename
        except Exception as err:  # noqa: BLE001 - a Ray rank's error wraps the OSError
            cause = getattr(err, "cause", None) or err
            if not (isinstance(cause, OSError) and cause.errno in DISK_FULL_ERRNOS):
                raise
            shutil.rmtree(partial, ignore_errors=True)
            raise CheckpointNotWritten(self._not_written(final.name, f"the disk filled while writing it ({cause.strerror})"
                                                         )) from None
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        _fsync(self.checkpoints)
        _write_atomically(self.checkpoints / "latest", final.name, durable=True)
        self._prune(self.cfg.trainer.keep_checkpoints)
        return final

    def complete_checkpoints(self) -> list[Path]:
        return sorted(p for p in self.checkpoints.glob("iter_*") if not p.name.endswith(".partial"))

    def _make_room(self, name: str) -> None:
        """Before writing: if the newest checkpoint's size does not fit in the free space, prune now
        what the keep-count would prune after the write (never the newest); if still too little, stop."""
        complete = self.complete_checkpoints()
        if not complete:
            return
        need = directory_bytes(complete[-1]) * CHECKPOINT_SIZE_MARGIN
        if shutil.disk_usage(self.checkpoints).free >= need:
            return
        self._prune(max(1, self.cfg.trainer.keep_checkpoints - 1))
        free = shutil.disk_usage(self.checkpoints).free
        if free < need:
            raise CheckpointNotWritten(self._not_written(
                name, f"the last one took {need / CHECKPOINT_SIZE_MARGIN / 1e9:.1f} GB and {free / 1e9:.1f} GB are free"))

    def _not_written(self, name: str, why: str) -> str:
        latest = self.checkpoints / "latest"
        kept = latest.read_text().strip() if latest.is_file() else None
        return (f"checkpoint {name} not written: {why} at {self.checkpoints}; "
                + (f"{kept} is intact and a resumed run continues from it" if kept else "no earlier checkpoint exists")
                + "; free disk space, lower trainer.keep_checkpoints or move trainer.output_dir")

    def _prune(self, keep: int) -> None:
        for old in self.complete_checkpoints()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


class CheckpointNotWritten(RuntimeError):
    """A checkpoint could not be written for lack of disk space; the message says what is intact."""


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
CHECKPOINT_SIZE_MARGIN = 1.05   # the next checkpoint is about the size of the last one


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
