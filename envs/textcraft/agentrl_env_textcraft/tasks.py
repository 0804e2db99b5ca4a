"""TextCraft tasks: the command list of one task (ADaPT's layout) and the named splits.

Every task is identified by one integer *layout seed* ``s``, exactly the ``seed`` of ADaPT's
``TextCraft.reset(seed)``:

* the goal is ``goals[s % len(goals)]`` (goals = items of min-depth >= 2, deepest first);
* the command list is the goal's whole recipe tree (every alternative recipe, recursively) plus up
  to 10 distractors: recipes that use the same inputs, sampled at most 10 per input;
* ``random.Random(s)`` drives the sampling and the final shuffle of the list.

Two details of the original decide the exact text, and both are kept so that layout ``s`` here is
the package's ``reset(seed=s)`` on a freshly loaded crafting tree (with a sorted recipe listing):

1. The original walks the tree by appending sub-recipes to the list it is iterating, so a
   recipe shared by several branches is visited several times, and the distractor sampler draws
   once per visit. We replay the same walk, on private copies of the recipe lists made for each
   task: the original appends into the crafting tree's own lists, so each of its resets changes
   later ones (and its crafting rules); here nothing is shared between tasks.
2. The original collects the lines in Python ``set`` objects before sampling and shuffling, so
   its order follows the per-process string hash. We keep first-seen order instead, which makes
   the layout reproducible on every machine and run.

Splits (all built from layout seeds, so every split is reproducible and the package can check it):

``adapt``     seeds 0..199, ADaPT's evaluation set (index i is the package's seed i).
``depth{d}``  every goal of min-depth d once, in goal order (index j: the j-th goal of depth d,
              seed = its position in the goal list): ``depth2`` 291, ``depth3`` 117, ``depth4`` 11.
``train``     80% of the goals of each depth (a seeded shuffle picks them), 4 layouts each
              (seeds p, p+n, p+2n, p+3n for goal position p and n goals), in seeded random order.
``test``      the other 20% of the goals (held apart from ``train``), 3 layouts each.
``train_depth2`` / ``test_depth2``  the depth-2 tasks of ``train`` / ``test``, in the same order:
              a held-out pair of easy splits (short plans) for tiny models; no goal is in both.
``pool_depth2`` / ``pool_depth2_test``  a small pool for tiny CPU runs: 32 of the ``train_depth2``
              goals (a seeded pick) in 12 layouts each (their 4 ``train`` layouts and seeds
              p + 4n .. p + 11n) / 4 further layouts each (p + 12n .. p + 15n: other distractors and
              line order). The test layouts are in no other split, so a policy is measured on the
              pool's goals in tasks it never trained on.
``pool_depth2_wide``  the pool's goals in 60 layouts each: ``pool_depth2``'s 12 and 48 more
              (p + 16n .. p + 63n), never the test layouts: 1,920 tasks for RL that should carry over
              to unseen layouts rather than sharpen the ones SFT memorised.

``train`` and ``test`` leave out goals that cannot be crafted within ADaPT's 40-command budget
(the expert needs more): with the package's recipes that is only ``netherite block`` (9 netherite
ingots, each from 4 gold ingots, each from 9 nuggets: 48 commands). ``adapt`` and ``depth3`` keep
it, as the original does (seed 90 of ``adapt``), so they match the papers' task counts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import product

from agentrl_env_textcraft.expert import expert_plan
from agentrl_env_textcraft.recipes import Recipe, RecipeBook, display_name

MAX_DISTRACTORS = 10
SAMPLES_PER_INPUT = 10
ADAPT_EVAL_SEEDS = 200
TEST_FRACTION = 0.2
TRAIN_LAYOUTS = 4
TEST_LAYOUTS = 3
SPLIT_SEED = 20240611
MAX_TAG_COMBINATIONS = 16
POOL_GOALS = 32
POOL_TRAIN_LAYOUTS = 12
POOL_TEST_LAYOUTS = 4
POOL_WIDE_EXTRA_LAYOUTS = 48  # pool_depth2_wide: layouts after the test ones
COMMAND_BUDGET = 40  # ADaPT's step limit; train/test goals must be solvable within it


@dataclass(frozen=True)
class TaskLayout:
    seed: int
    goal: str                   # item id of the goal
    depth: int                  # the goal's min-depth
    lines: tuple[str, ...]      # the crafting commands shown, in order
    observation: str            # the initial observation
    goal_line: str              # "Goal: craft X."
    admissible_actions: tuple[str, ...]


def walk_recipe_tree(book: RecipeBook, goal: str) -> list[Recipe]:
    """ADaPT's recipe-tree walk (with its repeated visits), on private copies of the lists."""
    lists: dict[str, list[Recipe]] = {}

    def walk(key: str, visited: frozenset[str]) -> list[Recipe]:
        if key in visited:
            return []
        recipes = lists.get(key)
        if recipes is None:
            recipes = list(book.recipes_for(key))
            if recipes:
                lists[key] = recipes
        inner = visited | {key}
        for recipe in recipes:  # the list grows while it is walked, as in the original
            for ing in recipe.inputs:
                recipes.extend(walk(ing.key, inner))
        return recipes

    return walk(goal, frozenset())


def build_layout(book: RecipeBook, seed: int) -> TaskLayout:
    rng = random.Random(seed)
    goal, depth = book.goals[seed % len(book.goals)]
    tree = walk_recipe_tree(book, goal)
    distractors: list[Recipe] = []
    for recipe in tree:
        for ing in recipe.inputs:
            pool = book.uses.get(ing.key)
            if pool:
                distractors.extend(rng.sample(pool, min(len(pool), SAMPLES_PER_INPUT)))
    tree_lines = dict.fromkeys(r.line for r in tree)
    distractor_lines = list(dict.fromkeys(r.line for r in distractors if r.line not in tree_lines))
    lines = list(tree_lines) + rng.sample(distractor_lines, min(len(distractor_lines), MAX_DISTRACTORS))
    rng.shuffle(lines)
    goal_line = f"Goal: craft {display_name(goal)}."
    observation = "Crafting commands:\n{}\n\n{}".format("\n".join(lines), goal_line)
    by_line: dict[str, Recipe] = {}
    for recipe in tree + distractors:
        by_line.setdefault(recipe.line, recipe)
    shown = [by_line[line] for line in lines]
    return TaskLayout(seed, goal, depth, tuple(lines), observation, goal_line,
                      admissible_commands(book, shown))


def admissible_commands(book: RecipeBook, shown: list[Recipe]) -> tuple[str, ...]:
    """A finite list of useful commands for a task (the original has none).

    ``inventory``; then ``get k X`` for every fetchable ingredient X of a shown recipe (k = that
    recipe's count; any count works); then one ``craft`` command per shown recipe, written with
    concrete items: a tag slot (``2 planks``) is filled with each member of the tag produced by a
    shown recipe (``2 oak planks``), capped at 16 combinations per recipe. Recipes whose tag slots
    have no shown member are left out, as are exact duplicates.
    """
    produced = [r.output for r in shown]
    gets: list[str] = []
    crafts: list[str] = []
    for recipe in shown:
        choices: list[list[str]] = []
        for ing in recipe.inputs:
            if ing.is_tag:
                members = [item for item in dict.fromkeys(produced) if book.item_tag.get(item) == ing.key]
                choices.append([f"{ing.count} {display_name(m)}" for m in members])
            else:
                if book.is_fetchable(ing.key):
                    gets.append(f"get {ing.count} {display_name(ing.key)}")
                choices.append([f"{ing.count} {display_name(ing.key)}"])
        head = f"craft {recipe.output_count} {display_name(recipe.output)} using "
        for n, combo in enumerate(product(*choices)):
            if n >= MAX_TAG_COMBINATIONS:
                break
            crafts.append(head + ", ".join(combo))
    return tuple(dict.fromkeys(["inventory", *gets, *crafts]))


def build_splits(book: RecipeBook) -> dict[str, tuple[int, ...]]:
    """Split name -> layout seeds. Depends only on the recipe book, so it is the same everywhere."""
    n = len(book.goals)
    splits: dict[str, tuple[int, ...]] = {"adapt": tuple(range(ADAPT_EVAL_SEEDS))}
    by_depth: dict[int, list[int]] = {}
    for position, (goal, depth) in enumerate(book.goals):
        by_depth.setdefault(depth, []).append(position)
    solvable = {p for p, (goal, _) in enumerate(book.goals)
                if len(expert_plan(book, goal)) <= COMMAND_BUDGET}
    train_goals: list[int] = []
    test_goals: list[int] = []
    for depth in sorted(by_depth):
        positions = by_depth[depth]
        splits[f"depth{depth}"] = tuple(positions)
        shuffled = [p for p in positions if p in solvable]
        random.Random(SPLIT_SEED + depth).shuffle(shuffled)
        n_test = round(TEST_FRACTION * len(shuffled))
        test_goals += sorted(shuffled[:n_test])
        train_goals += sorted(shuffled[n_test:])
    train = [p + n * k for k in range(TRAIN_LAYOUTS) for p in train_goals]
    test = [p + n * k for k in range(TEST_LAYOUTS) for p in test_goals]
    random.Random(SPLIT_SEED).shuffle(train)
    random.Random(SPLIT_SEED + 1).shuffle(test)
    splits["train"] = tuple(train)
    splits["test"] = tuple(test)
    for name in ("train", "test"):
        splits[f"{name}_depth2"] = tuple(s for s in splits[name] if book.goals[s % n][1] == 2)
    pool = [p for p in train_goals if book.goals[p][1] == 2]
    random.Random(SPLIT_SEED + 2).shuffle(pool)
    pool = pool[:POOL_GOALS]
    first_extra = POOL_TRAIN_LAYOUTS + POOL_TEST_LAYOUTS
    wide = [*range(POOL_TRAIN_LAYOUTS), *range(first_extra, first_extra + POOL_WIDE_EXTRA_LAYOUTS)]
    for name, layouts, salt in (("pool_depth2", range(POOL_TRAIN_LAYOUTS), 3),
                                ("pool_depth2_test", range(POOL_TRAIN_LAYOUTS, first_extra), 4),
                                ("pool_depth2_wide", wide, 5)):
        seeds = [p + n * k for k in layouts for p in pool]
        random.Random(SPLIT_SEED + salt).shuffle(seeds)
        splits[name] = tuple(seeds)
    return splits
