"""TextCraft: golden transcripts, protocol checks, splits and the expert solver."""

from __future__ import annotations

import json

import pytest

from agentrl.envs import REQUIRED_INFO_KEYS, TaskRef, make_env
from agentrl_env_textcraft.expert import expert_plan
from agentrl_env_textcraft.recipes import RecipeBook, default_data_dir
from agentrl_env_textcraft.tasks import COMMAND_BUDGET, build_splits

BOWL_TASK = TaskRef("depth2", 40)
BOWL_OBSERVATION = """Crafting commands:
craft 4 birch planks using 1 birch logs
craft 1 lime bed using 3 lime wool, 3 planks
craft 1 wooden pickaxe using 2 stick, 3 planks
craft 1 wooden hoe using 2 stick, 2 planks
craft 4 jungle planks using 1 jungle logs
craft 4 oak planks using 1 oak logs
craft 4 spruce planks using 1 spruce logs
craft 1 pink bed using 3 pink wool, 3 planks
craft 1 fletching table using 4 planks, 2 flint
craft 1 grindstone using 2 stick, 1 stone slab, 2 planks
craft 4 crimson planks using 1 crimson stems
craft 1 magenta bed using 3 magenta wool, 3 planks
craft 4 bowl using 3 planks
craft 4 warped planks using 1 warped stems
craft 4 acacia planks using 1 acacia logs
craft 1 cartography table using 4 planks, 2 paper
craft 1 piston using 1 redstone, 4 cobblestone, 3 planks, 1 iron ingot
craft 4 dark oak planks using 1 dark oak logs
craft 1 gray bed using 3 gray wool, 3 planks

Goal: craft bowl."""

# (action, observation, reward, terminated) for the bowl task, in order
BOWL_TRANSCRIPT = [
    ("inventory", "Inventory: You are not carrying anything.", 0.0, False),
    ("get 1 oak logs", "Got 1 oak logs", 0.0, False),
    ("get 2 planks", "Could not find planks", 0.0, False),
    ("get 1 stick", "Could not find stick", 0.0, False),
    ("get 3 unobtainium", "Could not find unobtainium", 0.0, False),
    ("craft 4 planks using 1 oak logs", "Could not find a valid recipe for ItemTagWithCount("
     "item_tag=ItemTag(tag='minecraft:planks', item_id=None), count=4)", 0.0, False),
    ("craft 4 oak planks using 1 oak logs", "Crafted 4 minecraft:oak_planks", 0.0, False),
    ("craft 4 oak planks using 1 oak logs",
     "Could not find enough items to craft minecraft:oak_planks", 0.0, False),
    ("craft 4 bowl using 3 planks", "Could not find enough items to craft minecraft:bowl", 0.0, False),
    ("craft 4 bowl using three oak planks", "Wrong item format: three oak planks", 0.0, False),
    ("craft 4 bowl using 2 oak planks", "Could not find a valid recipe for ItemTagWithCount("
     "item_tag=ItemTag(tag=None, item_id='minecraft:bowl'), count=4)", 0.0, False),
    ("get 0 flint", "Got 0 flint", 0.0, False),
    ("inventory", "Inventory: [oak planks] (4) [flint] (0) ", 0.0, False),
    ("Inventory", "Could not execute Inventory", 0.0, False),
    ("craft 9 bowl using 3 oak planks", "Crafted 4 minecraft:bowl", 1.0, True),
    ("inventory", "Inventory: [oak planks] (1) [flint] (0) [bowl] (4) ", 0.0, False),
]


@pytest.fixture(scope="module")
def env():
    return make_env("textcraft")


def test_golden_transcript(env):
    obs, info = env.reset(BOWL_TASK)
    assert obs == BOWL_OBSERVATION
    assert info["task"] == "Goal: craft bowl." and info["task_type"] == "depth2" and info["depth"] == 2
    won = False
    for action, want_obs, want_reward, want_terminated in BOWL_TRANSCRIPT:
        obs, reward, terminated, truncated, info = env.step(action)
        won = won or want_terminated
        assert (obs, reward, terminated, truncated) == (want_obs, want_reward, want_terminated, False), action
        assert info["won"] is won


def test_expert_transcript_and_admissible_actions(env):
    _, info = env.reset(BOWL_TASK)
    assert env.expert_actions() == ["get 1 acacia logs", "craft 4 acacia planks using 1 acacia logs",
                                    "craft 4 bowl using 3 acacia planks"]
    admissible = info["admissible_actions"]
    assert admissible[:3] == ["inventory", "get 1 birch logs", "get 1 jungle logs"]
    assert "get 2 flint" in admissible and "get 1 stone slab" not in admissible
    assert "craft 4 bowl using 3 oak planks" in admissible
    assert "craft 4 bowl using 3 dark oak planks" in admissible
    assert "craft 4 bowl using 3 planks" not in admissible  # tag slots are written with members
    assert len(admissible) == len(set(admissible))


def test_info_keys_on_reset_and_step(env):
    for task in (TaskRef("adapt", 0), TaskRef("train", 3), TaskRef("test", 7)):
        obs, info = env.reset(task)
        for infos in (info, env.step("inventory")[4]):
            assert set(REQUIRED_INFO_KEYS) <= set(infos)
            assert infos["split"] == task.split and infos["index"] == task.index
            assert infos["task_type"] == f"depth{infos['depth']}" and infos["depth"] in (2, 3, 4)
            assert infos["task"] == obs.splitlines()[-1] and infos["task"].startswith("Goal: craft ")
            assert infos["admissible_actions"][0] == "inventory"
            assert infos["noop"] is False
            json.dumps(infos)  # servable as JSON


def test_truncation_at_max_steps():
    short = make_env("textcraft", max_steps=3)
    short.reset(TaskRef("adapt", 1))
    steps = [short.step("jump") for _ in range(3)]
    flags = [step[2:4] for step in steps]
    assert all(step[0] == "Could not execute jump" and step[4]["noop"] is True for step in steps)
    assert flags == [(False, False), (False, False), (False, True)]
    assert make_env("textcraft").max_steps == 40


def test_noop_flags_the_commands_that_change_nothing():
    env = make_env("textcraft", max_steps=5)
    env.reset(TaskRef("adapt", 1))
    got, crafted = env.step("get 3 ink sac"), env.step("craft 1 stick using 9 dirt")
    assert got[0] == "Got 3 ink sac" and got[4]["noop"] is False
    assert crafted[0].startswith("Could not find enough items") and crafted[4]["noop"] is True


def test_winning_on_the_last_step_is_terminated_not_truncated():
    env = make_env("textcraft", max_steps=3)
    env.reset(BOWL_TASK)
    results = [env.step(a) for a in env.expert_actions()]
    assert results[-1][1:4] == (1.0, True, False)


@pytest.mark.parametrize("task, error", [
    (TaskRef("nope", 0), ValueError), (TaskRef("adapt", 200), ValueError),
    (TaskRef("depth4", -1), ValueError), (("adapt", 0), TypeError), (None, TypeError),
])
def test_bad_task_refs_are_rejected(env, task, error):
    with pytest.raises(error):
        env.reset(task)


def test_step_errors():
    fresh = make_env("textcraft")
    with pytest.raises(RuntimeError):
        fresh.step("inventory")
    with pytest.raises(RuntimeError):
        fresh.expert_actions()
    fresh.reset(TaskRef("adapt", 0))
    with pytest.raises(TypeError):
        fresh.step(None)
    fresh.reset({"split": "adapt", "index": 2})  # a TaskRef dict (the JSON form) is accepted
    assert fresh.task_ref == TaskRef("adapt", 2)


def test_resets_do_not_leak_state(env):
    first, _ = env.reset(TaskRef("adapt", 0))
    env.step("get 5 string")
    for i in range(1, 30):
        env.reset(TaskRef("adapt", i))
    again, _ = env.reset(TaskRef("adapt", 0))
    assert again == first
    assert env.step("inventory")[0] == "Inventory: You are not carrying anything."
    # the goal (cyan banner) can only be made by its own recipe, never by a sub-recipe's inputs
    # (the package's tree walk appends sub-recipes into the goal's recipe list)
    env.step("get 1 lapis lazuli")
    assert env.step("craft 1 cyan banner using 1 lapis lazuli")[0].startswith(
        "Could not find a valid recipe for")


def test_instances_are_independent():
    a, b = make_env("textcraft"), make_env("textcraft")
    a.reset(BOWL_TASK)
    b.reset(BOWL_TASK)
    a.step("get 3 flint")
    assert b.step("inventory")[0] == "Inventory: You are not carrying anything."


def test_splits(env):
    book = env.book
    sizes = env.split_sizes()
    assert sizes["adapt"] == 200
    assert (sizes["depth2"], sizes["depth3"], sizes["depth4"]) == (291, 117, 11)
    splits = env.splits
    assert splits["adapt"] == tuple(range(200))
    n = len(book.goals)
    for d in (2, 3, 4):
        assert all(book.goals[s][1] == d for s in splits[f"depth{d}"])
    train_goals = {s % n for s in splits["train"]}
    test_goals = {s % n for s in splits["test"]}
    assert not train_goals & test_goals
    assert len(splits["train"]) == 4 * len(train_goals) and len(splits["test"]) == 3 * len(test_goals)
    assert len(set(splits["train"])) == len(splits["train"])
    assert {book.goals[p][1] for p in test_goals} == {2, 3, 4}
    # every goal is in train or test except those beyond the command budget
    too_long = {p for p, (g, _) in enumerate(book.goals) if len(expert_plan(book, g)) > COMMAND_BUDGET}
    assert train_goals | test_goals | too_long == set(range(n))
    assert [book.goals[p][0] for p in too_long] == ["minecraft:netherite_block"]
    # a freshly loaded book (sorted listing, seeded shuffles) gives the same splits
    assert build_splits(RecipeBook(default_data_dir())) == splits


@pytest.mark.parametrize("split", ["adapt", "depth2", "depth3", "depth4", "train", "test"])
def test_expert_wins_every_task_in_a_sample(env, split):
    size = env.split_sizes()[split]
    for index in range(0, size, max(1, size // 40)):
        obs, info = env.reset(TaskRef(split, index))
        plan = env.expert_actions()
        if len(plan) > env.max_steps:
            assert info["goal"] == "minecraft:netherite_block"
            continue
        admissible = set(info["admissible_actions"])
        assert all(a in admissible for a in plan if a.startswith("craft")), (split, index)
        for action in plan:
            obs, reward, terminated, truncated, info = env.step(action)
            assert not obs.startswith("Could not"), (split, index, action, obs)
        assert (reward, terminated, info["won"]) == (1.0, True, True), (split, index)


def test_expert_wins_the_over_budget_goal_with_more_steps():
    long_env = make_env("textcraft", max_steps=60)
    long_env.reset(TaskRef("adapt", 90))
    plan = long_env.expert_actions()
    assert len(plan) == 48
    results = [long_env.step(a) for a in plan]
    assert results[-1][1:4] == (1.0, True, False)


def test_custom_data_dir(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    specs = {
        "oak_planks.json": {"type": "minecraft:crafting_shapeless", "group": "planks",
                            "ingredients": [{"tag": "minecraft:oak_logs"}],
                            "result": {"item": "minecraft:oak_planks", "count": 4}},
        "stick.json": {"type": "minecraft:crafting_shaped", "group": "sticks", "pattern": ["#", "#"],
                       "key": {"#": {"tag": "minecraft:planks"}},
                       "result": {"item": "minecraft:stick", "count": 4}},
        "ladder.json": {"type": "minecraft:crafting_shaped", "pattern": ["# #", "###", "# #"],
                        "key": {"#": {"item": "minecraft:stick"}}, "result": {"item": "minecraft:ladder",
                                                                              "count": 3}},
        "oak_planks_from_block.json": {"type": "minecraft:crafting_shapeless",
                                       "ingredients": [{"item": "minecraft:oak_block"}],
                                       "result": "minecraft:oak_planks"},
        "smelt.json": {"type": "minecraft:smelting", "ingredient": {"item": "minecraft:sand"},
                       "result": "minecraft:glass"},
    }
    for name, spec in specs.items():
        (recipes / name).write_text(json.dumps(spec))
    env = make_env("textcraft", data_dir=str(tmp_path))
    assert [g for g, _ in env.book.goals] == ["minecraft:ladder", "minecraft:stick"]
    obs, info = env.reset(TaskRef("depth3", 0))
    assert info["task"] == "Goal: craft ladder." and "craft 4 stick using 2 planks" in obs
    assert env.step("get 1 oak logs")[0] == "Got 1 oak logs"  # tag with no craftable member: an item
    plan = env.expert_actions()
    # 7 sticks = 2 batches of 4 = 4 planks = 1 batch of planks = 1 log
    assert plan == ["get 1 oak logs", "craft 4 oak planks using 1 oak logs",
                    "craft 4 stick using 2 oak planks", "craft 4 stick using 2 oak planks",
                    "craft 3 ladder using 7 stick"]
    env.reset(TaskRef("depth3", 0))
    assert [env.step(a)[1] for a in plan][-1] == 1.0
    with pytest.raises(FileNotFoundError):
        make_env("textcraft", data_dir=str(tmp_path / "missing"))
