"""TextCraft (ADaPT's Minecraft crafting benchmark) on the ``textcraft`` package's recipes.

``make_env("textcraft", max_steps=40, data_dir=None)``: ``data_dir`` is a folder holding
``recipes/*.json`` (Minecraft datapack format); None uses the installed ``textcraft`` package's
``data`` directory. See :mod:`agentrl.envs.textcraft.env` for the commands and
:mod:`agentrl.envs.textcraft.tasks` for the splits.
"""

from __future__ import annotations

from agentrl.envs import register_env
from agentrl.envs.textcraft.env import TextCraftEnv
from agentrl.envs.textcraft.recipes import RecipeBook, load_recipe_book


@register_env("textcraft")
def make_textcraft(max_steps: int = 40, data_dir: str | None = None) -> TextCraftEnv:
    return TextCraftEnv(max_steps=max_steps, data_dir=data_dir)


__all__ = ["RecipeBook", "TextCraftEnv", "load_recipe_book", "make_textcraft"]
