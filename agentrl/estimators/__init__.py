"""Group-based advantage estimators over a :class:`agentrl.data.StepBatch`.

Usage::

    from agentrl.estimators import compute_advantages
    advantages, diagnostics = compute_advantages("gigpo", batch, gamma=0.95, mode="mean_norm")

``advantages`` is a float32 tensor with one value per step record (the learner broadcasts it over
the step's response tokens); ``diagnostics`` is a dict of floats for the metrics tracker.

Estimators: ``grpo``, ``rloo``, ``gigpo``, ``gagpo``, ``bipace`` (one module each; formulas and
every choice in ``docs/estimators.md``). :data:`ESTIMATORS` maps each name to a function
``fn(batch, state=None, **params)``; :data:`PARAMS` maps it to the frozen dataclass with its
parameters, defaults and help text. Shared keys (:data:`SHARED_KEYS`) that an estimator does not
use are ignored, so one dict can serve every estimator; any other unknown key is an error.

``state`` carries what must survive across batches; only ``bipace`` with
``eps_mode="calibrate"`` uses it (a :class:`BiGPOState` the trainer keeps and checkpoints).

The learner asks :func:`uses_action_level_ratio` whether to replace token-level importance ratios
by one length-normalised ratio per action (:func:`action_level_ratio`), which GAGPO prescribes.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from agentrl.data import StepBatch
from agentrl.estimators import bipace, gagpo, gigpo, grpo, rloo  # noqa: F401  (registers the estimators)
from agentrl.estimators.bigpo_clustering import BiGPOState
from agentrl.estimators.gagpo import action_level_log_ratio, action_level_ratio
from agentrl.estimators.registry import SHARED_KEYS, get_spec, param_help, registered_names, resolve_params

# Estimators whose loss uses one length-normalised importance ratio per action.
ACTION_LEVEL_RATIO_ESTIMATORS = frozenset({"gagpo"})


def _entry(name: str) -> Callable[..., tuple[torch.Tensor, dict[str, float]]]:
    spec = get_spec(name)

    def estimate(batch: StepBatch, state: Any = None, **params: Any) -> tuple[torch.Tensor, dict[str, float]]:
        resolved = resolve_params(name, spec.params_cls, params)
        return spec.fn(batch, resolved, state if spec.stateful else None)

    estimate.__name__ = f"{name}_estimate"
    estimate.__doc__ = sys.modules[spec.fn.__module__].__doc__
    return estimate


ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, dict[str, float]]]] = {n: _entry(n) for n in registered_names()}
PARAMS: dict[str, type] = {n: get_spec(n).params_cls for n in registered_names()}


def compute_advantages(name: str, batch: StepBatch, state: Any = None, **params: Any
                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages (float32, one per step record) and diagnostics of estimator ``name``."""
    get_spec(name)  # the unknown-name error, with close matches
    return ESTIMATORS[name](batch, state=state, **params)


def uses_action_level_ratio(name: str, params: dict[str, Any] | None = None) -> bool:
    """True when the learner's loss should use :func:`action_level_ratio` for this estimator.

    That is GAGPO with ``action_level_ratio`` left at its default ``True``; every other estimator
    keeps token-level ratios. ``params`` is validated like in :func:`compute_advantages`.
    """
    spec = get_spec(name)
    resolved = resolve_params(name, spec.params_cls, dict(params or {}))
    return name in ACTION_LEVEL_RATIO_ESTIMATORS and bool(getattr(resolved, "action_level_ratio", False))


__all__ = [
    "ACTION_LEVEL_RATIO_ESTIMATORS", "BiGPOState", "ESTIMATORS", "PARAMS", "SHARED_KEYS", "action_level_log_ratio",
    "action_level_ratio", "compute_advantages", "param_help", "uses_action_level_ratio",
]
