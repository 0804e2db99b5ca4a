"""Estimator registry and parameter resolution.

Every estimator is a function ``fn(batch, params, state) -> (advantages, diagnostics)`` registered
under a name together with a frozen dataclass holding its parameters, their defaults and help
text (``dataclasses.field(metadata={"help": ...})``). :func:`resolve_params` turns a plain dict
(one config sub-section plus the shared keys) into that dataclass:

* keys that are fields of the estimator's dataclass are used;
* keys from :data:`SHARED_KEYS` that the estimator does not use are accepted and ignored, so a
  trainer can pass one dict to every estimator;
* any other key is rejected with a ``ValueError`` naming it, the closest accepted names and the
  full list of accepted ones.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable

import torch

from agentrl.data import StepBatch

# Keys that several estimators read. An estimator that does not use one of them ignores it.
SHARED_KEYS = frozenset({
    "gamma", "step_advantage_w", "mode", "epsilon", "episode_stats", "invalid_action_penalty", "penalty_mode",
})

MODES = ("mean_std_norm", "mean_norm")
EPISODE_STATS = ("steps", "trajectories")
PENALTY_MODES = ("after_discount", "in_reward")

Diagnostics = dict[str, float]
EstimatorFn = Callable[[StepBatch, Any, Any], tuple[torch.Tensor, Diagnostics]]


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
    name: str
    fn: EstimatorFn
    params_cls: type
    stateful: bool = False


_SPECS: dict[str, EstimatorSpec] = {}


def register_estimator(name: str, params_cls: type, stateful: bool = False):
    """Decorator: register ``fn(batch, params, state)`` under ``name`` with its params dataclass."""

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        _SPECS[name] = EstimatorSpec(name, fn, params_cls, stateful)
        return fn

    return decorator


def get_spec(name: str) -> EstimatorSpec:
    if name not in _SPECS:
        close = difflib.get_close_matches(str(name), list(_SPECS), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown advantage estimator {name!r}{hint} (available: {', '.join(sorted(_SPECS))})")
    return _SPECS[name]


def registered_names() -> list[str]:
    return sorted(_SPECS)


def resolve_params(name: str, params_cls: type, params: dict[str, Any]) -> Any:
    """Build ``params_cls`` from ``params``, ignoring unused shared keys, rejecting unknown ones."""
    accepted = [f.name for f in dataclasses.fields(params_cls)]
    used: dict[str, Any] = {}
    for key, value in params.items():
        if key in accepted:
            used[key] = value
        elif key not in SHARED_KEYS:
            close = difflib.get_close_matches(key, accepted, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"estimator {name!r} got an unknown parameter {key!r}{hint} "
                             f"(accepted: {', '.join(accepted)})")
    return params_cls(**used)


def param_help(params_cls: type) -> dict[str, tuple[Any, str]]:
    """``{field: (default, help)}`` for a params dataclass (for docs and the config layer)."""
    out = {}
    for f in dataclasses.fields(params_cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out[f.name] = (default, f.metadata.get("help", ""))
    return out


def check_choice(owner: str, key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{key} must be one of {', '.join(choices)}, got {value!r}")


def check_range(owner: str, key: str, value: float, low: float, high: float) -> None:
    if not (low <= float(value) <= high):
        raise ValueError(f"{owner}.{key} must be in [{low}, {high}], got {value!r}")
