"""Environments: one text protocol (:mod:`agentrl.envs.base`), a registry, and pooled servers.

Each environment lives in its own subpackage and registers a factory under its name::

    @register_env("textcraft")
    def make_textcraft(**kwargs) -> TextEnv: ...

``make_env(name, **kwargs)`` imports the subpackage on first use, so heavy dependencies (the
ALFWorld engine) load only when that environment is asked for.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Callable

from agentrl.envs.base import REQUIRED_INFO_KEYS, TaskRef, TextEnv

ENV_NAMES = ("alfworld", "webshop", "textcraft")

_FACTORIES: dict[str, Callable[..., TextEnv]] = {}


def register_env(name: str) -> Callable[[Callable[..., TextEnv]], Callable[..., TextEnv]]:
    def decorator(factory: Callable[..., TextEnv]) -> Callable[..., TextEnv]:
        _FACTORIES[name] = factory
        return factory

    return decorator


def make_env(name: str, **kwargs) -> TextEnv:
    """Build one environment instance by registered name."""
    if name not in _FACTORIES and name in ENV_NAMES:
        importlib.import_module(f"agentrl.envs.{name}")
    if name not in _FACTORIES:
        close = difflib.get_close_matches(name, ENV_NAMES, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown environment {name!r}{hint} (available: {', '.join(ENV_NAMES)})")
    return _FACTORIES[name](**kwargs)


__all__ = ["ENV_NAMES", "REQUIRED_INFO_KEYS", "TaskRef", "TextEnv", "make_env", "register_env"]
