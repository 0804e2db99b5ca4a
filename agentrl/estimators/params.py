"""How an estimator declares its parameters: the one definition of each key, its default, its help
text and what it accepts.

An estimator's ``Params`` is a frozen dataclass whose fields are made with :func:`param` (its own
keys) or :func:`shared` (a key several estimators read, defined once in :class:`SharedParams`)::

    @dataclasses.dataclass(frozen=True)
    class Params:
        gamma: float = shared("gamma")
        lam: float = param(0.8, "GAE lambda (1: Monte-Carlo)", min=0, max=1)

The configuration is generated from these fields: shared keys are ``algorithm.<key>``, an
estimator's own keys ``algorithm.<estimator name>.<key>`` (an estimator loaded by import path:
``algorithm.params.<key>``); ``agentrl config --keys`` and ``docs/configuration.md`` show their
defaults, bounds and help. The checks use the config's vocabulary:

``choices``  accepted values;  ``min``/``max`` inclusive bounds;  ``gt`` an exclusive lower bound.

:func:`check_params` applies them whenever a ``Params`` object is built through the registry, so a
value set in Python is checked like one set on the command line.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

MODES = ("mean_std_norm", "mean_norm")
EPISODE_STATS = ("steps", "trajectories")
PENALTY_MODES = ("after_discount", "in_reward")


def param(default: Any = None, help: str = "", *, factory: Any = None, **checks: Any) -> Any:
    """A parameter field: default (or ``factory``), one line of help, checks (choices, min, max, gt)."""
    meta = {"help": help, **checks}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class SharedParams:
    """Keys that several estimators read, defined once; the config shows them as ``algorithm.<key>``.
    An estimator reads one by declaring a field ``name: type = shared("name")``."""

    gamma: float = param(0.95, "discount of the step return G_t = r_t + gamma * G_{t+1}", min=0, max=1)
    step_advantage_w: float = param(1.0, "omega: weight of the step term in A = A_episode + omega * A_step", min=0)
    mode: str = param("mean_std_norm", "mean_std_norm: (x - mean) / (std + epsilon) with the unbiased std; "
                      "mean_norm: x - mean (episode and step terms)", choices=MODES)
    epsilon: float = param(1e-6, "added to standard deviations before dividing", gt=0)
    episode_stats: str = param("steps", "statistics of the episode term over the group's step rows (steps, the "
                               "reference code) or over one return per trajectory (trajectories, the papers' "
                               "equation)", choices=EPISODE_STATS)
    penalty_mode: str = param("after_discount", "where the invalid-action penalty (StepBatch.invalid_penalty) "
                              "enters: charged to the invalid row after discounting, not propagated to earlier "
                              "steps (after_discount, the reference code), or an ordinary reward (in_reward)",
                              choices=PENALTY_MODES)


SHARED_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(SharedParams)}


def shared(name: str) -> Any:
    """A field that reads the shared key ``name`` (same default, help and checks as :class:`SharedParams`)."""
    if name not in SHARED_FIELDS:
        raise ValueError(f"{name!r} is not a shared estimator key (shared keys: {', '.join(SHARED_FIELDS)})")
    f = SHARED_FIELDS[name]
    return dataclasses.field(default=f.default, metadata={**f.metadata, "shared": True})


def is_shared(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("shared"))


def own_fields(params_cls: type) -> list[dataclasses.Field]:
    """The fields of ``params_cls`` that are the estimator's own (not shared keys)."""
    return [f for f in dataclasses.fields(params_cls) if not is_shared(f)]


def shared_fields(params_cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(params_cls) if is_shared(f)]


def field_default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def describe(meta: dict[str, Any], typ: Any) -> str:
    """What a field accepts, in words (``one of a, b``; ``float >= 0 <= 1``)."""
    if "choices" in meta:
        return "one of " + ", ".join(map(str, meta["choices"]))
    parts = [getattr(typ, "__name__", str(typ)).replace("typing.", "")]
    for key, word in (("min", ">="), ("gt", ">"), ("max", "<=")):
        if key in meta:
            parts.append(f"{word} {meta[key]}")
    if "off_or_min" in meta:
        parts.append(f"0 (off) or >= {meta['off_or_min']}")
    if "off_or_gt" in meta:
        parts.append(f"0 (off) or > {meta['off_or_gt']}")
    return " ".join(parts)


def violates(value: Any, meta: dict[str, Any]) -> bool:
    """True when ``value`` breaks one of the checks in ``meta`` (choices and bounds)."""
    if "choices" in meta and value not in meta["choices"]:
        return True
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return ("min" in meta and value < meta["min"] or "gt" in meta and value <= meta["gt"]
            or "max" in meta and value > meta["max"]
            or value != 0 and ("off_or_min" in meta and value < meta["off_or_min"]
                               or "off_or_gt" in meta and value <= meta["off_or_gt"]))


def check_params(owner: str, params: Any) -> Any:
    """``params`` if every field satisfies its declared type and checks, else ValueError naming the key."""
    hints = typing.get_type_hints(type(params))
    for f in dataclasses.fields(params):
        value, typ = getattr(params, f.name), hints[f.name]
        wrong_type = (typ is bool and not isinstance(value, bool)
                      or typ is int and (isinstance(value, bool) or not isinstance(value, int))
                      or typ is float and (isinstance(value, bool) or not isinstance(value, (int, float)))
                      or typ is str and not isinstance(value, str))
        if wrong_type or violates(value, dict(f.metadata)):
            raise ValueError(f"{owner}.{f.name} must be {describe(dict(f.metadata), typ)}, got {value!r}")
    return params


def param_help(params_cls: type) -> dict[str, tuple[Any, str]]:
    """``{field: (default, help)}`` of a params dataclass."""
    return {f.name: (field_default(f), f.metadata.get("help", "")) for f in dataclasses.fields(params_cls)}


__all__ = ["EPISODE_STATS", "MODES", "PENALTY_MODES", "SHARED_FIELDS", "SharedParams", "check_params", "describe",
           "field_default", "is_shared", "own_fields", "param", "param_help", "shared", "shared_fields", "violates"]
