"""Learner checkpoints: model, optimizer, scheduler, RNG and counters of every rank, written to
``<dir>.partial`` and renamed (a mix-in of :class:`agentrl.learner.engine.Learner`)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

from agentrl.learner import distributed

CHECKPOINT_TAG = "state"


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])



class LearnerCheckpoints:
    """``save_checkpoint`` / ``load_checkpoint`` of a :class:`~agentrl.learner.engine.Learner` (its
    ``engine``, ``ranks``, ``update_calls`` and ``optimizer_steps``)."""

    def save_checkpoint(self, directory: str) -> Path:
        """Model, optimizer, scheduler, RNG and counters; written to ``<dir>.partial`` then renamed."""
        target = Path(directory)
        tmp = target.with_name(target.name + ".partial")
        if self.ranks.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        distributed.barrier()
        client_state = {"update_calls": self.update_calls, "optimizer_steps": self.optimizer_steps}
        self.engine.save_checkpoint(str(tmp), tag=CHECKPOINT_TAG, client_state=client_state, save_latest=False)
        torch.save(_rng_state(), tmp / f"rng_rank{self.rank}.pt")
        distributed.barrier()
        if self.ranks.is_main:
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        distributed.barrier()
        return target

    def load_checkpoint(self, directory: str) -> None:
        directory = Path(directory)
        if not (directory / CHECKPOINT_TAG).is_dir():
            raise FileNotFoundError(f"{directory} is not a learner checkpoint (no {CHECKPOINT_TAG}/ inside)")
        _, client_state = self.engine.load_checkpoint(str(directory), tag=CHECKPOINT_TAG, load_optimizer_states=True,
                                                      load_lr_scheduler_states=True)
        client_state = client_state or {}
        self.update_calls = int(client_state.get("update_calls", 0))
        self.optimizer_steps = int(client_state.get("optimizer_steps", 0))
        rng_file = directory / f"rng_rank{self.rank}.pt"
        if rng_file.is_file():
            _set_rng_state(torch.load(rng_file, weights_only=False))
