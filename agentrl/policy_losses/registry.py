"""The policy losses by name: built-in ones found by discovery (one module each in
:mod:`agentrl.policy_losses.builtin`), installed ones by entry point (group ``agentrl.policy_losses``),
a user's by import path (``learner.policy_loss=my_pkg.my_mod:MyLoss``).

Parameters: a built-in loss reads the config section ``learner.<name>`` (generated from its
``Params``); one loaded by import path or installed reads ``learner.policy_loss_params``, checked
against its ``Params``. :func:`check_composition` and :func:`resolve_agg_mode` are the refusals made
when the config loads and again when the loss settings are built.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any, Optional

from agentrl.errors import UsageError
from agentrl.estimators.params import check_params
from agentrl.plugins import PluginError, PluginRegistry
from agentrl.policy_losses.base import AGG_MODES, RATIO_KINDS, PolicyLoss

PARAMS_SECTION = "learner.policy_loss_params"     # the parameters of a loss that is not built in
DEFAULT = "vanilla"


def check_policy_loss_class(obj: Any, where: str) -> type[PolicyLoss]:
    """``obj`` if it is a usable policy-loss class, else :class:`PluginError` naming what is wrong."""
    if not (inspect.isclass(obj) and issubclass(obj, PolicyLoss)):
        raise PluginError(f"{where} is not a policy loss: subclass agentrl.policy_losses.PolicyLoss "
                          "(docs/learner.md, 'Add a policy loss')")
    if inspect.isabstract(obj):
        raise PluginError(f"{where} does not define token_losses(self, inputs) -> LossTerms "
                          "(agentrl.policy_losses.PolicyLoss)")
    if not isinstance(obj.name, str) or not obj.name.isidentifier():
        raise PluginError(f"{where} needs a class attribute name = '<identifier>' (got {obj.name!r})")
    if not (inspect.isclass(obj.Params) and dataclasses.is_dataclass(obj.Params)):
        raise PluginError(f"{where}.Params is not a dataclass (fields made with agentrl.policy_losses.param)")
    for f in dataclasses.fields(obj.Params):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PluginError(f"{where}.Params.{f.name} has no default: give it one with param(default, help)")
    if obj.ratio not in RATIO_KINDS:
        raise PluginError(f"{where}.ratio={obj.ratio!r}: one of {', '.join(RATIO_KINDS)}")
    modes = obj.agg_modes if obj.agg_modes is not None else AGG_MODES
    if not set(modes) <= set(AGG_MODES) or obj.default_agg_mode not in modes:
        raise PluginError(f"{where}: default_agg_mode={obj.default_agg_mode!r} and agg_modes={obj.agg_modes!r} "
                          f"must be among {', '.join(AGG_MODES)} (the default one of them)")
    return obj


POLICY_LOSSES: PluginRegistry[type[PolicyLoss]] = PluginRegistry(
    "policy loss", key="learner.policy_loss", package="agentrl.policy_losses.builtin",
    check=check_policy_loss_class, entry_point_group="agentrl.policy_losses",
    order=lambda cls: (cls.table_rank, cls.name))


def register_policy_loss(cls: type[PolicyLoss]) -> type[PolicyLoss]:
    """Class decorator: make ``cls`` a built-in policy loss under ``cls.name`` (its section: ``learner.<name>``)."""
    return POLICY_LOSSES.register(cls)


def builtin_policy_losses() -> dict[str, type[PolicyLoss]]:
    """The losses that ship in agentrl.policy_losses.builtin, by name, in table order."""
    return POLICY_LOSSES.builtin()


def policy_loss_class(spec: str) -> type[PolicyLoss]:
    """A built-in or installed loss by name, or a user's by import path ``package.module:ClassName``."""
    return POLICY_LOSSES.get(spec)


def is_builtin(cls: type[PolicyLoss]) -> bool:
    return builtin_policy_losses().get(cls.name) is cls


def build_policy_loss(spec: str = DEFAULT, params: Optional[dict[str, Any]] = None) -> PolicyLoss:
    """A loss from its name (or import path) and its own parameter values; an unknown key or a value
    its ``Params`` refuses is a one-line :class:`UsageError`."""
    cls = policy_loss_class(spec)
    params = dict(params or {})
    names = [f.name for f in dataclasses.fields(cls.Params)]
    for key in params:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"policy loss {cls.name!r} has no parameter {key!r}{hint} "
                             f"(its parameters: {', '.join(names) or 'none'})")
    try:
        return cls(check_params(f"{params_key(cls)}", cls.Params(**params)))
    except (TypeError, ValueError) as err:
        raise UsageError(f"learner.policy_loss={spec}: {err}") from None


def params_key(cls: type[PolicyLoss]) -> str:
    """Where the config holds ``cls``'s parameters: ``learner.<name>`` or ``learner.policy_loss_params``."""
    return f"learner.{cls.name}" if is_builtin(cls) else PARAMS_SECTION


def policy_loss_values(learner_cfg: Any) -> dict[str, Any]:
    """The configured loss's own parameter values: its section ``learner.<name>`` (built in) or
    ``learner.policy_loss_params`` (import path, installed)."""
    cls = policy_loss_class(getattr(learner_cfg, "policy_loss", DEFAULT))
    if is_builtin(cls):
        section = getattr(learner_cfg, cls.name, None)
        if section is None:
            return {}
        return {f.name: getattr(section, f.name) for f in dataclasses.fields(cls.Params)}
    return dict(getattr(learner_cfg, "policy_loss_params", None) or {})


def resolve_agg_mode(cls: type[PolicyLoss], mode: Optional[str]) -> str:
    """``learner.loss_agg_mode`` for ``cls``: null is the loss's own default; a mode it does not accept
    is refused."""
    if mode is None:
        return cls.default_agg_mode
    if mode not in AGG_MODES:
        raise UsageError(f"learner.loss_agg_mode={mode!r} is not an aggregation (one of {', '.join(AGG_MODES)}, "
                         "or null for the loss's own)")
    if cls.agg_modes is not None and mode not in cls.agg_modes:
        raise UsageError(f"learner.policy_loss={cls.name} takes learner.loss_agg_mode {' or '.join(cls.agg_modes)} "
                         f"only, got {mode}: set one of those or null (docs/learner.md, 'Policy losses')")
    return mode


def check_composition(cls: type[PolicyLoss], *, action_level_ratio: bool, behaviour_weight: bool) -> None:
    """Refuse, in one line, what ``cls`` cannot compose with: an estimator's action-level ratio when
    the loss uses no importance ratio, the behaviour weight when it declares it cannot take one."""
    if action_level_ratio and cls.ratio == "none":
        raise UsageError(f"learner.policy_loss={cls.name} uses no importance ratio, but the estimator asks for an "
                         "action-level one (LossOptions.action_level_ratio): turn that option off in the "
                         "estimator's section (algorithm.<estimator>.action_level_ratio=false) or choose a loss "
                         "with a ratio (docs/learner.md, 'What composes with what')")
    if behaviour_weight and not cls.takes_behaviour_weight:
        raise UsageError(f"learner.policy_loss={cls.name} cannot take the behaviour weight (learner.rollout_is_cap, "
                         "on by default with trainer.mode one_step_off or async): set learner.rollout_is_cap=0, "
                         "trainer.mode=sync, or another loss")


__all__ = ["DEFAULT", "PARAMS_SECTION", "POLICY_LOSSES", "build_policy_loss", "builtin_policy_losses",
           "check_composition", "check_policy_loss_class", "is_builtin", "params_key", "policy_loss_class",
           "policy_loss_values", "register_policy_loss", "resolve_agg_mode"]
