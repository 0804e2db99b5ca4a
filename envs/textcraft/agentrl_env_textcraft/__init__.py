"""TextCraft (ADaPT's Minecraft crafting benchmark) on the ``textcraft`` package's recipes.

``make_env("textcraft", max_steps=40, data_dir=None)``: ``data_dir`` is a folder holding
``recipes/*.json`` (Minecraft datapack format); None uses the installed ``textcraft`` package's
``data`` directory. See :mod:`agentrl_env_textcraft.env` for the commands and
:mod:`agentrl_env_textcraft.tasks` for the splits.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.envs.spec import ActionSpec, EnvSpec, PromptSpec, ResultSpec
from agentrl_env_textcraft.env import TextCraftEnv
from agentrl_env_textcraft.recipes import RecipeBook, load_recipe_book

_HERE = Path(__file__).resolve().parent


def make_textcraft(max_steps: int = 40, data_dir: str | None = None) -> TextCraftEnv:
    return TextCraftEnv(max_steps=max_steps, data_dir=data_dir)


SPEC = EnvSpec(
    name="textcraft",
    make_env=make_textcraft,
    splits=("train", "test"),   # and per-depth and pool splits (agentrl_env_textcraft.tasks)
    # the crafting commands appear only in the first observation, yet every later step needs them:
    # the task line is that whole first observation (commands + goal)
    prompt=PromptSpec(preamble="You are an expert agent crafting items in a Minecraft-like environment.",
                      task_source="first_observation", admissible_layout="quoted"),
    actions=ActionSpec(lowercase=False, fallback_chars=30),
    results=ResultSpec(title="TextCraft (success % by depth)", success_column="All", per_type=True,
                       published=str(_HERE / "published.yaml")),
    recipes_dir=str(_HERE / "recipe_files"),
    description="TextCraft: crafting Minecraft items from recipe commands (ADaPT)",
)

__all__ = ["SPEC", "RecipeBook", "TextCraftEnv", "load_recipe_book", "make_textcraft"]
