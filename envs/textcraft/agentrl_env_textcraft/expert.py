"""TextCraft's expert solver: walk the goal's recipe tree and craft bottom-up."""

from __future__ import annotations

import functools
import math

from agentrl_env_textcraft.recipes import Ingredient, Recipe, RecipeBook, display_name


@functools.lru_cache(maxsize=4096)
def expert_plan(book: RecipeBook, goal: str) -> tuple[str, ...]:
    """The expert's commands for crafting ``goal`` from an empty inventory (cached per process)."""
    return tuple(ExpertPlanner(book).plan(goal))


class ExpertPlanner:
    """Walks the goal's recipe tree: fetch what is missing, craft bottom-up, cheapest recipes first.

    Each item is made with the recipe of lowest estimated command count (ties: the first in book
    order); a tag slot uses a member already held, else the cheapest member to make. Ingredients
    gathered for a recipe are held back while its other ingredients are made, so sub-crafts never
    eat them. The plan is simulated on an inventory, so every command in it succeeds in order.
    """

    def __init__(self, book: RecipeBook):
        self.book = book
        self._cost: dict[str, float] = {}

    def cost(self, key: str) -> float:
        """Estimated commands to obtain one batch of ``key`` (1 for a fetchable item)."""
        if key not in self._cost:
            self._cost[key] = math.inf  # guards against cycles while computing
            recipes = self.book.recipes_for(key)
            self._cost[key] = min((self.recipe_cost(r) for r in recipes), default=1.0)
        return self._cost[key]

    def recipe_cost(self, recipe: Recipe) -> float:
        return 1.0 + sum(self.cost(ing.key) for ing in recipe.inputs)

    def best_recipe(self, key: str) -> Recipe:
        return min(self.book.recipes_for(key), key=self.recipe_cost)

    def plan(self, goal: str) -> list[str]:
        actions: list[str] = []
        inventory: dict[str, int] = {}
        self._make(goal, 1, inventory, actions)
        return actions

    def _resolve(self, ing: Ingredient, need: int, inventory: dict[str, int]) -> str:
        if not ing.is_tag:
            return ing.key
        for item, held in inventory.items():
            if held >= need and self.book.item_tag.get(item) == ing.key:
                return item
        return self.best_recipe(ing.key).output

    def _make(self, item: str, need: int, inventory: dict[str, int], actions: list[str]) -> None:
        held = inventory.get(item, 0)
        if held >= need:
            return
        missing = need - held
        if not self.book.is_craftable(item):
            actions.append(f"get {missing} {display_name(item)}")
            inventory[item] = held + missing
            return
        recipe = self.best_recipe(item)
        batches = math.ceil(missing / recipe.output_count)
        reserved: list[tuple[str, int]] = []
        for ing in recipe.inputs:
            amount = ing.count * batches
            concrete = self._resolve(ing, amount, inventory)
            self._make(concrete, amount, inventory, actions)
            inventory[concrete] -= amount
            reserved.append((concrete, ing.count))
        parts = ", ".join(f"{n} {display_name(k)}" for k, n in reserved)
        for _ in range(batches):
            actions.append(f"craft {recipe.output_count} {display_name(item)} using {parts}")
        inventory[item] = inventory.get(item, 0) + recipe.output_count * batches
