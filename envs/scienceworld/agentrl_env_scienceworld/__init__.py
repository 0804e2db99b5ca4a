"""ScienceWorld (Wang et al., 2022) on its own engine, the ``scienceworld`` package (a Scala simulator
in a JVM; Java 17 needed).

``make_env("scienceworld", max_steps=100, simplifications="", deterministic=True)``:
``simplifications`` is the engine's comma-separated list (``easy``, ``teleportAction``,
``openDoors``, ...), "" for the benchmark's setting; ``deterministic`` starts the engine's JVM so
that a variation always gives the same world (:mod:`agentrl_env_scienceworld.engine`).
The protocol is in :mod:`agentrl_env_scienceworld.env`, the splits in
:mod:`agentrl_env_scienceworld.tasks`, the identity check against the engine in
:mod:`agentrl_env_scienceworld.check`.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.envs.spec import ActionSpec, EnvSpec, PromptSpec, ResultSpec


def make_scienceworld(max_steps: int = 100, simplifications: str = "", deterministic: bool = True):
    from agentrl_env_scienceworld.env import ScienceWorldTextEnv

    return ScienceWorldTextEnv(max_steps=max_steps, simplifications=simplifications, deterministic=deterministic)


SPEC = EnvSpec(
    name="scienceworld",
    make_env=make_scienceworld,
    splits=("train", "dev", "test"),
    prompt=PromptSpec(preamble="You are an expert agent doing science experiments in a text-based world.",
                      task_source="info", admissible_layout="quoted"),
    actions=ActionSpec(lowercase=True, fallback_chars=30),
    results=ResultSpec(title="ScienceWorld (success % by task type)", score_column="Score"),
    recipes_dir=str(Path(__file__).with_name("recipe_files")),
    description="ScienceWorld's 30 science task types on its own engine (scienceworld 1.2.3, Java 17)",
)

__all__ = ["SPEC", "make_scienceworld"]
