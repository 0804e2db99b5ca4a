"""The estimator interface: one class per estimator, declaring everything the system needs from it.

An estimator turns a :class:`~agentrl.data.StepBatch` (one row per environment step) into one
advantage per row. Besides the computation it declares, so that no other layer has to know which
estimator runs:

* ``Params``: its parameters (a frozen dataclass of :func:`~agentrl.estimators.params.param` and
  :func:`~agentrl.estimators.params.shared` fields): the config, the command line, the help texts
  and ``docs/configuration.md`` are generated from it;
* :meth:`Estimator.row_inputs`: per-row inputs beyond what every rollout records, e.g. the actor's
  hidden state at the last prompt token of layer L (the rollout backend records it during its
  prefill, or the learner's log-prob pass computes it before the estimator runs);
* :meth:`Estimator.loss_options`: what the learner's loss must do differently, e.g. one
  length-normalised importance ratio per action instead of one per token;
* ``State``: what must survive from one batch to the next (kept by the trainer and saved in every
  checkpoint through ``as_dict()``/``from_dict()``), or None.

A minimal estimator (see ``docs/estimators.md`` for the walk-through)::

    from agentrl.estimators import Estimator, param, shared

    class MeanBaseline(Estimator):
        name = "mean_baseline"
        title = "Mean baseline"

        @dataclasses.dataclass(frozen=True)
        class Params:
            scale: float = param(1.0, "multiplies every advantage", gt=0)

        def advantages(self, batch, state=None):
            ...
            return advantages, {"some_diagnostic": 0.0}
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import torch

from agentrl.data import StepBatch

Diagnostics = dict[str, float]


@dataclasses.dataclass(frozen=True)
class RowInputs:
    """Per-row inputs an estimator needs besides the rollout's columns.

    ``hidden_layer``: fill ``StepBatch.hidden`` with the actor's hidden state at the last prompt
    token of this entry of Hugging Face's ``hidden_states`` (0 = embeddings, negative = from the
    top); None = not needed.
    """

    hidden_layer: int | None = None


@dataclasses.dataclass(frozen=True)
class LossOptions:
    """What the learner's clipped loss does for this estimator.

    ``action_level_ratio``: every token of a step shares one importance ratio, ``exp(mean over the
    step's trained tokens of (logp - old_logp))``, instead of one ratio per token.
    """

    action_level_ratio: bool = False


class Estimator(abc.ABC):
    """Base class of every advantage estimator (built in or a user's, loaded by import path)."""

    name: ClassVar[str] = ""               # registry key and config section: algorithm.<name>
    title: ClassVar[str] = ""              # how tables and plots name it
    table_rank: ClassVar[int] = 1000       # column order in tables (smaller first)
    Params: ClassVar[type]                 # frozen dataclass of param()/shared() fields
    State: ClassVar[type | None] = None    # kept across batches and checkpointed, or None

    def __init__(self, params: Any = None):
        self.params = params if params is not None else self.Params()

    def row_inputs(self) -> RowInputs:
        """Per-row inputs this configuration needs (default: none beyond the rollout's columns)."""
        return RowInputs()

    def loss_options(self) -> LossOptions:
        """What the loss does differently for this configuration (default: nothing)."""
        return LossOptions()

    def new_state(self) -> Any:
        """A fresh state (None for a stateless estimator)."""
        return self.State() if self.State is not None else None

    def restore_state(self, saved: dict[str, Any] | None) -> Any:
        """The state saved by ``state.as_dict()`` in a checkpoint, or a fresh one."""
        if self.State is None:
            return None
        return self.State.from_dict(saved) if saved else self.State()

    @abc.abstractmethod
    def advantages(self, batch: StepBatch, state: Any = None) -> tuple[torch.Tensor, Diagnostics]:
        """One float32 advantage per row of ``batch`` and a dict of float diagnostics."""

    def step_groups(self, batch: StepBatch, state: Any = None) -> torch.Tensor | None:
        """The step groups this estimator compares a row with (anchor-state groups, hidden-state
        clusters): one integer label per row, equal labels one group, for ``agentrl inspect``; None
        for an estimator that compares whole episodes only (the default)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"


__all__ = ["Diagnostics", "Estimator", "LossOptions", "RowInputs"]
