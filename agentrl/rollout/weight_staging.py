"""New weights for a rollout worker's back end: loaded now when no rollout runs, else staged and loaded
at the engine's next step boundary (or between two tokens of a generate call, where the back end
decodes token by token here), never in the middle of a generate call.

    staging = WeightStaging(backend, engine)
    with staging.rolling_out():                 # a rollout call (or one step of the group pool)
        engine.run(...)                         # engine.before_generate = staging.at_step_boundary
    staging.take(state, version)                # from a weight path's receiver (agentrl.weights)

A newer sync replaces one not loaded yet. The policy version of the weights loaded is the engine's
``policy_version``, recorded on every step generated with them.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch

from agentrl.runtime.denormals import flush_denormals


@dataclass
class StagedWeights:
    state: Mapping[str, torch.Tensor]
    version: int | None


class WeightStaging:
    """The weights of one back end and the engine that stamps their version (see the module docstring)."""

    def __init__(self, backend: Any, engine: Any, between_tokens: bool = False):
        self.backend, self.engine = backend, engine
        self.lock = threading.Lock()
        self.active = False             # a rollout call (or a group pool step) runs
        self.staged: StagedWeights | None = None
        engine.before_generate = self.at_step_boundary
        if between_tokens and backend.loads_weights_between_tokens:
            backend.weights_between_tokens = self.between_tokens

    def take(self, state: Mapping[str, torch.Tensor], version: int | None) -> None:
        """Load ``state`` now, or at the next step boundary while a rollout runs; ``version``: the policy
        version they are (None keeps the current number)."""
        with self.lock:
            self.staged = StagedWeights(state, version)
            if not self.active:
                self._load_staged()

    def load_between_rollouts(self, load: Callable[[], None], version: int | None, why: str) -> None:
        """Run ``load`` now (a load that cannot wait for a step boundary); refused while a rollout runs."""
        with self.lock:
            if self.active:
                raise RuntimeError(f"{why}; use rollout.weight_sync=broadcast with trainer.mode one_step_off or async")
            load()
            if version is not None:
                self.engine.policy_version = int(version)

    @contextlib.contextmanager
    def rolling_out(self) -> Iterator[None]:
        """A rollout runs inside the block; weights that arrived meanwhile are loaded when it ends."""
        self.begin()
        try:
            yield
        finally:
            self.end()

    def begin(self) -> None:
        with self.lock:
            self.active = True

    def end(self, load_staged: bool = True) -> None:
        with self.lock:
            self.active = False
            if load_staged:
                self._load_staged()

    def at_step_boundary(self) -> None:
        """The engine's step boundary: load weights that arrived during the rollout."""
        with self.lock:
            self._load_staged()

    def between_tokens(self) -> int:
        """Between two tokens of a generate call: load weights that arrived; the version now running."""
        with self.lock:
            if self.staged is not None:
                self._load_staged()
            return self.engine.policy_version

    def status(self) -> tuple[bool, int | None]:
        """Whether a rollout runs, and the version of weights waiting for a step boundary (None if none)."""
        with self.lock:
            return self.active, self.staged.version if self.staged is not None else None

    def _load_staged(self) -> None:
        staged, self.staged = self.staged, None
        if staged is None:
            return
        flush_denormals()
        self.backend.load_weights(staged.state)
        if staged.version is not None:
            self.engine.policy_version = int(staged.version)


__all__ = ["StagedWeights", "WeightStaging"]
