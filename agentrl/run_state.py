"""A run's directory: its config, checkpoints, and what a resumed run needs to go on.

Layout of ``<trainer.output_dir>/<run name>/``::

    config.yaml                 the resolved config of the first start
    metrics.jsonl, tensorboard/ tracking
    init_model/, sft_model/     the starting policy (tiny recipes)
    checkpoints/iter_000010/    learner/ (model, optimizer, RNG) + trainer_state.json
    checkpoints/latest          name of the newest complete checkpoint
    final_model/                the trained policy as a Hugging Face directory

A checkpoint is written to ``iter_N.partial`` and renamed when complete; ``latest`` is replaced
atomically after that, so a kill at any moment leaves the previous checkpoint usable.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

from agentrl.config import Config, config_to_yaml
from agentrl.envs import TaskRef, make_env
from agentrl.errors import UsageError


@dataclasses.dataclass
class TrainerState:
    iteration: int = 0
    model_dir: str | None = None          # the starting policy the learner was built from
    estimator_state: dict[str, Any] | None = None
    schedule_state: dict[str, Any] | None = None    # the prioritized curriculum's outcomes per goal

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
        path = Path(cfg.trainer.output_dir).expanduser() / name
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

    def save(self, state: TrainerState, learner) -> Path:
        """Write a complete checkpoint for ``state.iteration`` and point ``latest`` at it."""
        final = self.checkpoint_dir(state.iteration)
        partial = final.with_name(final.name + ".partial")
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True)
        learner.save_checkpoint(str(partial / "learner"))
        (partial / "trainer_state.json").write_text(state.to_json())
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        _write_atomically(self.checkpoints / "latest", final.name)
        self._prune()
        return final

    def _prune(self) -> None:
        complete = sorted(p for p in self.checkpoints.glob("iter_*") if not p.name.endswith(".partial"))
        for old in complete[: -self.cfg.trainer.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)


class TaskSchedule:
    """Which tasks iteration ``i`` trains on: a pure function of (seed, i).

    The training split is walked in epochs; each epoch is a fresh seeded shuffle. Because nothing
    but the iteration number is needed, a resumed run continues with exactly the tasks the killed
    run would have used.
    """

    def __init__(self, split: str, size: int, per_iteration: int, seed: int):
        if size < 1:
            raise UsageError(f"training split {split!r} is empty")
        self.split, self.size, self.per_iteration, self.seed = split, size, per_iteration, seed

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def _env(env_name: str, kwargs_json: str):
        return make_env(env_name, **json.loads(kwargs_json))

    @classmethod
    def env_for(cls, env_cfg):
        """One environment instance per (name, kwargs), built once per process, for what the
        schedule asks about splits (sizes, goals); it is never reset."""
        return cls._env(env_cfg.name, json.dumps(dict(env_cfg.kwargs), sort_keys=True))

    @classmethod
    def split_sizes(cls, env_cfg) -> dict[str, int]:
        return dict(cls.env_for(env_cfg).split_sizes())

    @classmethod
    def checked_split_size(cls, env_cfg, split: str, key: str) -> int:
        """The number of tasks in ``split``; a usage error naming ``key`` (the setting that chose the
        split) when the environment has no such split."""
        sizes = cls.split_sizes(env_cfg)
        if split not in sizes:
            raise UsageError(f"{key}={split!r} is not a split of {env_cfg.name}; available: {', '.join(sorted(sizes))}")
        return sizes[split]

    @classmethod
    def for_split(cls, env_cfg, seed: int) -> "TaskSchedule":
        size = cls.checked_split_size(env_cfg, env_cfg.train_split, "env.train_split")
        return cls(env_cfg.train_split, size, env_cfg.tasks_per_iteration, seed)

    @functools.lru_cache(maxsize=4)
    def _epoch_order(self, epoch: int) -> tuple[int, ...]:
        order = list(range(self.size))
        random.Random(self.seed * 7919 + epoch).shuffle(order)
        return tuple(order)

    def tasks_for(self, iteration: int) -> list[TaskRef]:
        start = (iteration - 1) * self.per_iteration
        positions = range(start, start + self.per_iteration)
        return [TaskRef(self.split, self._epoch_order(p // self.size)[p % self.size]) for p in positions]

    # the interface agentrl.curriculum.PrioritizedSchedule adds to; a uniform schedule keeps no state
    def record(self, episodes) -> None:
        """Outcomes do not change a uniform schedule."""

    def as_dict(self) -> None:
        return None

    def metrics(self, tasks: list[TaskRef]) -> dict[str, float]:
        return {}
