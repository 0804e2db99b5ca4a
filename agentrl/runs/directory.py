"""A run's directory: its config, checkpoints, and what a resumed run needs to go on.

Layout of ``<trainer.output_dir>/<run name>/``::

    config.yaml                 the resolved config of the first start
    metrics.jsonl, tensorboard/ tracking
    init_model/, sft_model/     the starting policy (tiny recipes)
    checkpoints/iter_000010/    learner/ (model, optimizer, RNG) + trainer_state.json
                                (+ rollout_buffer/ with trainer.mode one_step_off or async)
    checkpoints/latest          name of the newest complete checkpoint
    final_model/                the trained policy as a Hugging Face directory

A checkpoint is written to ``iter_N.partial`` and renamed when complete; ``latest`` is replaced
atomically after that, so a kill at any moment leaves the previous checkpoint usable.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
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


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
        """The state of the checkpoint to resume from (``trainer.resume``), or None to start fresh."""
        resume = self.cfg.trainer.resume
        if resume == "never":
            return None
        if resume == "auto":
            pointer = self.checkpoints / "latest"
            if not pointer.is_file():
                return None
            directory = self.checkpoints / pointer.read_text().strip()
        else:
            directory = Path(resume).expanduser()
        state_file = directory / "trainer_state.json"
        if not state_file.is_file():
            raise UsageError(f"cannot resume from {directory}: it has no trainer_state.json (not a complete "
                             "agentrl checkpoint); pass trainer.resume=auto or a checkpoints/iter_N directory")
        state = TrainerState.from_json(state_file.read_text())
        if directory.parent != self.checkpoints:  # resuming another run's checkpoint: copy it in first
            self.checkpoints.mkdir(parents=True, exist_ok=True)
            shutil.copytree(directory, self.checkpoint_dir(state.iteration), dirs_exist_ok=True)
        return state

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
        _write_atomically(self.checkpoints / "latest", final.name)
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
