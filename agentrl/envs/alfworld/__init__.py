"""ALFWorld on the real ``alfworld``/TextWorld engine, with offline game generation.

Importing this package does not import the engine (``textworld`` takes seconds to import and may
be absent); the engine loads when an env is built or a game is generated.

``make_env("alfworld", max_steps=50, data_dir=None)`` serves games from ``data_dir``, else from
``$ALFWORLD_DATA`` when it holds the official data, else from a generated set cached under
``~/.cache/agentrl/alfworld/`` (see :mod:`agentrl.envs.alfworld.data`).
"""

from __future__ import annotations

from agentrl.envs import register_env
from agentrl.envs.alfworld.tasks import SPLITS, TASK_TYPE_SHORT_NAMES, TASK_TYPES, short_task_type


@register_env("alfworld")
def make_alfworld(max_steps: int = 50, data_dir: str | None = None, **kwargs):
    from agentrl.envs.alfworld.env import ALFWorldEnv

    return ALFWorldEnv(max_steps=max_steps, data_dir=data_dir, **kwargs)


__all__ = ["SPLITS", "TASK_TYPES", "TASK_TYPE_SHORT_NAMES", "make_alfworld", "short_task_type"]
