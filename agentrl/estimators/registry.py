"""The estimator registry: built-in estimators by name, a user's by import path.

* Built-in estimators are the :class:`~agentrl.estimators.base.Estimator` subclasses decorated
  with :func:`register_estimator` in :mod:`agentrl.estimators.builtin`, one module or subpackage
  each; every one of them is imported on first use (adding one is one module, nothing to list
  elsewhere).
* ``algorithm.estimator=my_package.my_module:MyEstimator`` loads a user's class from their own
  code (the module must be importable: installed, or on ``PYTHONPATH``); it is checked like a
  built-in one, and a bad path or a class that does not follow the interface is a
  :class:`EstimatorLoadError` (a :class:`~agentrl.errors.UsageError`: one line, exit code 2).

:func:`build_params` turns a plain dict into an estimator's ``Params``: its fields are used, shared
keys it does not read are ignored (so one dict serves every estimator), anything else is an
error naming the key, the close matches and the accepted names.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import pkgutil
from typing import Any

from agentrl.errors import UsageError
from agentrl.estimators.base import Estimator
from agentrl.estimators.params import SHARED_FIELDS, check_params, is_shared, shared_fields

_BUILTIN: dict[str, type[Estimator]] = {}
_LOADED: dict[str, type[Estimator]] = {}      # import path -> class
_discovered = False


class EstimatorLoadError(UsageError):
    """An estimator named in the config cannot be found, imported or used."""


def register_estimator(cls: type[Estimator]) -> type[Estimator]:
    """Class decorator: make ``cls`` a built-in estimator under ``cls.name``."""
    check_estimator_class(cls, f"{cls.__module__}.{cls.__qualname__}")
    if cls.name in _BUILTIN and _BUILTIN[cls.name] is not cls:
        raise ValueError(f"two estimators are named {cls.name!r}: {_BUILTIN[cls.name].__module__} and {cls.__module__}")
    _BUILTIN[cls.name] = cls
    return cls


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    import agentrl.estimators.builtin as package     # discovery: the package imports each estimator module

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")


def builtin_estimators() -> dict[str, type[Estimator]]:
    """The built-in estimators, in table order."""
    _discover()
    return dict(sorted(_BUILTIN.items(), key=lambda item: (item[1].table_rank, item[0])))


def registered_names() -> list[str]:
    return list(builtin_estimators())


def is_import_path(spec: str) -> bool:
    return ":" in str(spec)


def check_estimator_class(cls: Any, where: str) -> type[Estimator]:
    """``cls`` if it follows the estimator interface, else :class:`EstimatorLoadError` naming what is wrong."""
    if not (inspect.isclass(cls) and issubclass(cls, Estimator)):
        raise EstimatorLoadError(f"{where} is not an estimator class: subclass agentrl.estimators.Estimator "
                                 "(docs/estimators.md, 'Write your own estimator')")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise EstimatorLoadError(f"{where} does not define {missing}(batch, state=None) -> (advantages, diagnostics)")
    if not isinstance(cls.name, str) or not cls.name.isidentifier():
        raise EstimatorLoadError(f"{where} needs a class attribute name = '<identifier>' (got {cls.name!r})")
    params = getattr(cls, "Params", None)
    if not (inspect.isclass(params) and dataclasses.is_dataclass(params)):
        raise EstimatorLoadError(f"{where} needs a nested frozen dataclass Params (its parameters; may be empty)")
    for f in dataclasses.fields(params):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise EstimatorLoadError(f"{where}.Params.{f.name} has no default: give it one with param(default, help)")
        if is_shared(f) and f.name not in SHARED_FIELDS:
            raise EstimatorLoadError(f"{where}.Params.{f.name} is marked shared but is not a shared key")
    state = cls.State
    if state is not None and not (callable(getattr(state, "as_dict", None)) and callable(getattr(state, "from_dict", None))):
        raise EstimatorLoadError(f"{where}.State needs as_dict() and a classmethod from_dict(dict) (it is checkpointed)")
    return cls


def load_estimator_class(path: str) -> type[Estimator]:
    """The class named by ``package.module:ClassName``, imported and checked (cached per path)."""
    if path in _LOADED:
        return _LOADED[path]
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise EstimatorLoadError(f"algorithm.estimator={path!r} is not an import path: write package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EstimatorLoadError(f"algorithm.estimator={path!r}: cannot import {module_name!r} ({err}); install its "
                                 "package or put its directory on PYTHONPATH") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EstimatorLoadError(f"algorithm.estimator={path!r}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    cls = check_estimator_class(obj, path)
    if cls.name in builtin_estimators() and builtin_estimators()[cls.name] is not cls:
        raise EstimatorLoadError(f"{path} is named {cls.name!r}, the name of a built-in estimator: choose another name")
    _LOADED[path] = cls
    return cls


def estimator_class(spec: str) -> type[Estimator]:
    """A built-in estimator by name, or a user's by import path ``package.module:ClassName``."""
    spec = str(spec)
    if is_import_path(spec):
        return load_estimator_class(spec)
    known = builtin_estimators()
    if spec not in known:
        close = difflib.get_close_matches(spec, list(known), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise EstimatorLoadError(f"unknown advantage estimator {spec!r}{hint} (built in: {', '.join(known)}; or "
                                 "an import path package.module:ClassName)")
    return known[spec]


def estimator_title(spec: str) -> str:
    """How tables name an estimator (its ``title``), or ``spec`` itself when it cannot be loaded."""
    try:
        cls = estimator_class(spec)
    except UsageError:
        return str(spec)
    return cls.title or cls.name


def build_params(cls: type[Estimator], values: dict[str, Any]) -> Any:
    """``cls.Params`` from ``values``: unused shared keys ignored, unknown keys and bad values rejected."""
    accepted = [f.name for f in dataclasses.fields(cls.Params)]
    used: dict[str, Any] = {}
    for key, value in values.items():
        if key in accepted:
            used[key] = value
        elif key not in SHARED_FIELDS:
            close = difflib.get_close_matches(key, accepted, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"estimator {cls.name!r} got an unknown parameter {key!r}{hint} "
                             f"(accepted: {', '.join(accepted) or 'none'})")
    try:
        params = cls.Params(**used)
    except TypeError as err:
        raise ValueError(f"estimator {cls.name!r}: {err}") from None
    return check_params(cls.name, params)


def build_estimator(spec: str, **values: Any) -> Estimator:
    """An estimator instance from a name (or import path) and its parameter values."""
    cls = estimator_class(spec)
    return cls(build_params(cls, values))


def estimator_from_config(algorithm, spec: str | None = None) -> Estimator:
    """The configured estimator: ``algorithm.estimator`` (or ``spec``) with the shared keys
    ``algorithm.<key>`` it reads and its own section (``algorithm.<name>``, or ``algorithm.params``
    for the import path the config names)."""
    spec = algorithm.estimator if spec is None else spec
    cls = estimator_class(spec)
    values = {f.name: getattr(algorithm, f.name) for f in shared_fields(cls.Params)}
    if is_import_path(spec):
        own = dict(algorithm.params) if spec == algorithm.estimator else {}
    else:
        section = getattr(algorithm, cls.name)
        own = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
    try:
        return cls(build_params(cls, {**values, **own}))
    except ValueError as err:
        raise UsageError(f"algorithm: {err}") from None


__all__ = ["EstimatorLoadError", "build_estimator", "build_params", "builtin_estimators", "check_estimator_class",
           "estimator_class", "estimator_from_config", "estimator_title", "is_import_path", "load_estimator_class",
           "register_estimator", "registered_names"]
