"""Environments: one text protocol (:mod:`agentrl.envs.base`), the declarations environment packages
make (:mod:`agentrl.envs.spec`), and pooled servers (:mod:`agentrl.envs.server`).

Each environment is a package of its own (``envs/<name>/`` in this repository, installed as
``agentrl-env-<name>``) whose ``SPEC`` declares it; ``make_env(name, **kwargs)`` builds one
instance of the environment ``name`` names (a registered name or ``package.module:SPEC`` /
``package.module:make_env``). Environment packages import their heavy dependencies (the ALFWorld
engine) when an instance is built, not when they are found.
"""

from __future__ import annotations

from agentrl.envs.base import REQUIRED_INFO_KEYS, TaskRef, TextEnv
from agentrl.envs.spec import EnvSpec, env_names, env_spec, register_env


def make_env(name: str, **kwargs) -> TextEnv:
    """Build one environment instance by name (see :func:`agentrl.envs.spec.env_spec`)."""
    return env_spec(name).make_env(**kwargs)


__all__ = ["EnvSpec", "REQUIRED_INFO_KEYS", "TaskRef", "TextEnv", "env_names", "env_spec", "make_env", "register_env"]
