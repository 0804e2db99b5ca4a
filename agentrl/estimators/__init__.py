"""Group-based advantage estimators over a :class:`agentrl.data.StepBatch`.

Every estimator is one class (:class:`Estimator`) in one module: its parameters, the per-row
inputs it needs, its loss options and its state are declared there, and every other layer asks
the registry instead of naming an estimator. Usage::

    from agentrl.estimators import build_estimator, compute_advantages
    estimator = build_estimator("gigpo", gamma=0.95, mode="mean_norm")
    advantages, diagnostics = estimator.advantages(batch)
    advantages, diagnostics = compute_advantages("gigpo", batch, gamma=0.95)     # the same, in one call

``advantages`` is a float32 tensor with one value per step record (the learner broadcasts it over
the step's response tokens); ``diagnostics`` is a dict of floats for the metrics tracker.

Built in (formulas and every choice in ``docs/estimators.md``), one module or subpackage each
in :mod:`agentrl.estimators.builtin`: ``grpo``, ``rloo``, ``reinforce_pp`` (REINFORCE++-baseline),
``gigpo``, ``gagpo``, ``bipace``. This package holds what they share: the interface (``base``,
``params``), the registry that finds them (``registry``), tensor pieces (``common``) and their
per-record specification (``reference``). A user's estimator is loaded by import path,
``algorithm.estimator=my_package.my_module:MyEstimator``.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.data import StepBatch
from agentrl.estimators.base import Diagnostics, Estimator, LossOptions, RowInputs
from agentrl.estimators.params import SHARED_FIELDS, SharedParams, param, param_help, shared
from agentrl.estimators.registry import (EstimatorLoadError, build_estimator, build_params, builtin_estimators,
                                         estimator_class, estimator_from_config, estimator_title, is_import_path,
                                         register_estimator, registered_names)


def compute_advantages(spec: str, batch: StepBatch, state: Any = None, **params: Any
                       ) -> tuple[torch.Tensor, Diagnostics]:
    """Advantages (float32, one per step record) and diagnostics of estimator ``spec`` (a name or
    an import path) with ``params``; shared keys it does not read are ignored."""
    return build_estimator(spec, **params).advantages(batch, state)


__all__ = [
    "Diagnostics", "Estimator", "EstimatorLoadError", "LossOptions", "RowInputs", "SHARED_FIELDS", "SharedParams",
    "build_estimator", "build_params", "builtin_estimators",
    "compute_advantages", "estimator_class", "estimator_from_config", "estimator_title", "is_import_path", "param",
    "param_help", "register_estimator", "registered_names", "shared",
]
