"""TextCraft environment: ADaPT's crafting protocol over the Minecraft 1.16.5 recipe book.

Commands and feedback (byte-for-byte those of ADaPT's TextCraft):

``get N X``                  ``Got N X``; ``Could not find X`` when X is craftable, a tag or unknown.
``craft N X using k A, ...``  the inputs must match one of X's recipes exactly (counts included; a
                             tag slot accepts any member item); N is ignored, one recipe batch is
                             made: ``Crafted 4 minecraft:stick``. Failures, checked in this order:
                             ``Wrong item format: <part>``, ``Could not find enough items to craft
                             <id>``, ``Could not find a valid recipe for ItemTagWithCount(...)``.
``inventory``                ``Inventory: [oak planks] (2) `` or ``Inventory: You are not carrying
                             anything.``
anything else                ``Could not execute <action>``.

Reward 1 and ``terminated`` when the crafted item is the goal. The task text, splits and
admissible actions are described in :mod:`agentrl_env_textcraft.tasks`.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from agentrl.envs.base import TaskRef, TextEnv
from agentrl_env_textcraft.expert import expert_plan
from agentrl_env_textcraft.recipes import Recipe, RecipeBook, display_name, item_key, load_recipe_book
from agentrl_env_textcraft.tasks import TaskLayout, build_layout, build_splits

CRAFT_RE = re.compile(r"craft (.*) using (.*)")
GET_RE = re.compile(r"get ([0-9]+) (.*)")
# the replies of a command that changed nothing (info["noop"])
NOOP_REPLIES = ("Could not ", "Wrong item format: ")
COUNT_RE = re.compile(r"([0-9]+) (.*)")

_LAYOUTS: dict[tuple[str, int], TaskLayout] = {}


@functools.lru_cache(maxsize=8)
def _splits(book: RecipeBook) -> dict[str, tuple[int, ...]]:
    return build_splits(book)


def task_layout(book: RecipeBook, seed: int) -> TaskLayout:
    """The layout of seed ``seed`` (built once per process and cached: it never changes)."""
    key = (book.data_dir, seed)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _LAYOUTS[key] = build_layout(book, seed)
    return layout


class TextCraftEnv(TextEnv):
    """Craft the goal item from fetchable base items, following the listed recipes."""

    name = "textcraft"

    def __init__(self, max_steps: int = 40, data_dir: str | None = None):
        super().__init__(max_steps=max_steps)
        self.book = load_recipe_book(data_dir)
        self.splits = _splits(self.book)
        self.layout: TaskLayout | None = None
        self.inventory: dict[str, int] = {}

    # ----- protocol hooks ----------------------------------------------------------------------
    def split_sizes(self) -> dict[str, int]:
        return {name: len(seeds) for name, seeds in self.splits.items()}

    def layout_seed(self, task: TaskRef) -> int:
        """The ADaPT/package seed of a task: ``TextCraft.reset(seed=...)`` shows the same task."""
        return self.splits[task.split][task.index]

    def _reset_task(self, task: TaskRef) -> tuple[str, dict[str, Any]]:
        self.layout = task_layout(self.book, self.layout_seed(task))
        self.inventory = {}
        return self.layout.observation, self._info(False)

    def _info(self, won: bool) -> dict[str, Any]:
        layout = self.layout
        return {"admissible_actions": list(layout.admissible_actions), "won": won,
                "task": layout.goal_line, "task_type": f"depth{layout.depth}", "depth": layout.depth,
                "goal": layout.goal, "layout_seed": layout.seed}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        obs, crafted_goal = self._respond(action)
        info = self._info(self.won or crafted_goal)
        info["noop"] = obs.startswith(NOOP_REPLIES)
        return obs, 1.0 if crafted_goal else 0.0, crafted_goal, info

    # ----- commands ----------------------------------------------------------------------------
    def _respond(self, action: str) -> tuple[str, bool]:
        match = CRAFT_RE.match(action)
        if match:
            return self._craft(match.group(1), match.group(2))
        match = GET_RE.match(action)
        if match:
            return self._get(int(match.group(1)), match.group(2)), False
        if action.startswith("inventory"):
            if not self.inventory:
                return "Inventory: You are not carrying anything.", False
            return "Inventory: " + "".join(f"[{display_name(k)}] ({n}) "
                                           for k, n in self.inventory.items()), False
        return f"Could not execute {action}", False

    def _get(self, amount: int, text: str) -> str:
        if not self.book.is_fetchable(item_key(text)):
            return f"Could not find {text}"
        key = item_key(text)
        self.inventory[key] = self.inventory.get(key, 0) + amount
        return f"Got {amount} {text}"

    def _craft(self, output_text: str, inputs_text: str) -> tuple[str, bool]:
        book = self.book
        match = COUNT_RE.match(output_text)
        out_count = int(match.group(1)) if match else 1
        out_key = item_key(match.group(2) if match else output_text)
        out_is_tag = out_key in book.tags
        given: list[tuple[str, int]] = []
        all_items = True
        for part in inputs_text.split(","):
            part = part.strip()
            match = COUNT_RE.match(part)
            if not match:
                return f"Wrong item format: {part}", False
            key = item_key(match.group(2))
            all_items = all_items and key not in book.tags
            given.append((key, int(match.group(1))))
        out_id = None if out_is_tag else out_key
        if not all_items or any(self.inventory.get(k, -1) < n for k, n in given):
            return f"Could not find enough items to craft {out_id}", False
        recipe = None if out_is_tag else self._matching_recipe(book.item_recipes.get(out_key, ()), given)
        if recipe is None:
            tag, item = (out_key, None) if out_is_tag else (None, out_key)
            return ("Could not find a valid recipe for ItemTagWithCount(item_tag=ItemTag("
                    f"tag={tag!r}, item_id={item!r}), count={out_count!r})"), False
        for key, n in given:
            left = self.inventory.get(key, 0) - n
            if left > 0:
                self.inventory[key] = left
            else:
                del self.inventory[key]
        self.inventory[recipe.output] = self.inventory.get(recipe.output, 0) + recipe.output_count
        return f"Crafted {recipe.output_count} {recipe.output}", recipe.output == self.layout.goal

    def _matching_recipe(self, recipes: tuple[Recipe, ...], given: list[tuple[str, int]]) -> Recipe | None:
        """The first recipe whose inputs are exactly ``given`` (a tag slot takes any member)."""
        item_tag = self.book.item_tag
        for recipe in recipes:
            if len(recipe.inputs) != len(given):
                continue
            left = list(given)
            for ing in recipe.inputs:
                for pos, (key, _) in enumerate(left):
                    if (item_tag.get(key) == ing.key) if ing.is_tag else (key == ing.key):
                        break
                else:
                    break
                if left[pos][1] != ing.count:
                    break
                del left[pos]
            else:
                return recipe
        return None

    # ----- expert ------------------------------------------------------------------------------
    def expert_actions(self) -> list[str]:
        if self.layout is None:
            raise RuntimeError("textcraft: expert_actions() called before reset()")
        return list(expert_plan(self.book, self.layout.goal))
