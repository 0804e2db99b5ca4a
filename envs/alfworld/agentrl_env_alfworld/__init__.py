"""ALFWorld on the real ``alfworld``/TextWorld engine, with offline game generation.

Importing this package does not import the engine (``textworld`` takes seconds to import and may
be absent); the engine loads when an env is built or a game is generated.

``make_env("alfworld", max_steps=50, data_dir=None)`` serves games from ``data_dir``, else from
``$ALFWORLD_DATA`` when it holds the official data, else from a generated set cached under
``~/.cache/agentrl/alfworld/`` (see :mod:`agentrl_env_alfworld.data`).
"""

from __future__ import annotations

from pathlib import Path

from agentrl.envs.spec import ActionSpec, EnvSpec, PromptSpec, ResultSpec
from agentrl_env_alfworld.tasks import SPLITS, TASK_TYPE_SHORT_NAMES, TASK_TYPES, short_task_type


_HERE = Path(__file__).resolve().parent


def make_alfworld(max_steps: int = 50, data_dir: str | None = None, **kwargs):
    from agentrl_env_alfworld.env import ALFWorldEnv

    return ALFWorldEnv(max_steps=max_steps, data_dir=data_dir, **kwargs)


SPEC = EnvSpec(
    name="alfworld",
    make_env=make_alfworld,
    splits=tuple(SPLITS),
    prompt=PromptSpec(preamble="You are an expert agent operating in the ALFRED Embodied Environment.",
                      task_source="info", admissible_layout="lines"),
    actions=ActionSpec(lowercase=True, fallback_chars=30),      # its commands are lower case
    results=ResultSpec(title="ALFWorld (success %)", columns=(*TASK_TYPE_SHORT_NAMES.values(), "All"),
                       success_column="All", per_type=True, type_columns=dict(TASK_TYPE_SHORT_NAMES),
                       published=str(_HERE / "published.yaml")),
    recipes_dir=str(_HERE / "recipe_files"),
    cli="agentrl_env_alfworld.cli",
    description="ALFWorld: household tasks in TextWorld games (the real alfworld engine)",
    switches=(("AGENTRL_ALFWORLD_ENGINE_CACHES=0", "on",
               "ALFWorld without its engine caches (the same texts, ~15x slower steps)"),
              ("ALFWORLD_DATA", "unset: generated games", "the official ALFWorld data (after `alfworld-download`)")),
)

__all__ = ["SPEC", "SPLITS", "TASK_TYPES", "TASK_TYPE_SHORT_NAMES", "make_alfworld", "short_task_type"]
