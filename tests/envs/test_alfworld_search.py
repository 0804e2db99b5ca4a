"""The searching ALFWorld expert: its decision rule on engine-format text, then played in the engine.

The rule tests need no engine; the engine tests generate a few small-room games with
``solver="search"`` (the searching expert must win them) and replay them through the env.
"""

from __future__ import annotations

import importlib.util

import pytest

from agentrl_env_alfworld.expert import (
    SearchExpert, SearchGoal, held_object, listed_receptacles, observed_receptacle, parse_goal, search_action)

ROOM = ("You are in the middle of a room. Looking quickly around you, you see a cabinet 2, a cabinet 1, "
        "a countertop 1, a drawer 1, a microwave 1, a sinkbasin 1, and a toilet 1.")
RECEPTACLES = ["cabinet 2", "cabinet 1", "countertop 1", "drawer 1", "microwave 1", "sinkbasin 1", "toilet 1"]
BASE = ["help", "inventory", "look"]


def goes(*names: str, here: str | None = None) -> list[str]:
    return [f"go to {r}" for r in RECEPTACLES if r != here and r not in names] + BASE


def test_parse_goal_covers_every_template():
    cases = {
        "Your task is to: put some spraybottle on toilet.":
            SearchGoal("pick_and_place_simple", "spraybottle", "toilet"),
        "put a mug in coffeemachine": SearchGoal("pick_and_place_simple", "mug", "coffeemachine"),
        "look at cd under the desklamp.": SearchGoal("look_at_obj_in_light", "cd", None, "desklamp"),
        "examine the pen with the floorlamp.": SearchGoal("look_at_obj_in_light", "pen", None, "floorlamp"),
        "put a clean cloth in cabinet.": SearchGoal("pick_clean_then_place_in_recep", "cloth", "cabinet"),
        "clean some cloth and put it in cabinet.": SearchGoal("pick_clean_then_place_in_recep", "cloth", "cabinet"),
        "put a hot egg in fridge.": SearchGoal("pick_heat_then_place_in_recep", "egg", "fridge"),
        "heat some egg and put it in fridge.": SearchGoal("pick_heat_then_place_in_recep", "egg", "fridge"),
        "put a cool apple in diningtable.": SearchGoal("pick_cool_then_place_in_recep", "apple", "diningtable"),
        "cool some apple and put it in diningtable.":
            SearchGoal("pick_cool_then_place_in_recep", "apple", "diningtable"),
        "put two pillow in sofa.": SearchGoal("pick_two_obj_and_place", "pillow", "sofa"),
        "find two pillow and put them in sofa.": SearchGoal("pick_two_obj_and_place", "pillow", "sofa"),
    }
    for text, goal in cases.items():
        assert parse_goal(text) == goal, text
    with pytest.raises(ValueError):
        parse_goal("Your task is to: juggle three apples.")


def test_observation_parsing():
    first = "-= Welcome to TextWorld, ALFRED! =-\n\n" + ROOM + "\n\nYour task is to: put some soapbar on toilet."
    assert listed_receptacles(first) == RECEPTACLES
    assert SearchExpert(first).goal == SearchGoal("pick_and_place_simple", "soapbar", "toilet")
    where = {
        "You arrive at drawer 1. The drawer 1 is closed.": "drawer 1",
        "You arrive at countertop 1. On the countertop 1, you see a soapbar 1.": "countertop 1",
        "You open the cabinet 2. The cabinet 2 is open. In it, you see nothing.": "cabinet 2",
        "You pick up the soapbar 1 from the countertop 1.": "countertop 1",
        "You move the soapbar 1 to the toilet 1.": "toilet 1",
        "You heat the egg 1 using the microwave 1.": "microwave 1",
        "The cabinet 1 is closed.": "cabinet 1",
        "On the toilet 1, you see a candle 1.": "toilet 1",
        ROOM: None, "Nothing happens.": None,
    }
    for observation, place in where.items():
        assert observed_receptacle(observation) == place, observation
    assert held_object(["examine cabinet 1", "examine soapbar 1", "look"], RECEPTACLES) == "soapbar 1"
    assert held_object(["examine cabinet 1", "look"], RECEPTACLES) is None


def test_search_visits_in_listed_order_opens_and_takes_the_first_visible_target():
    goal = parse_goal("put some soapbar on toilet")
    act = lambda obs, adm: search_action(goal, RECEPTACLES, obs, adm)  # noqa: E731
    assert act(ROOM, goes()) == "go to cabinet 2"
    closed = "You arrive at cabinet 2. The cabinet 2 is closed."
    assert act(closed, goes(here="cabinet 2") + ["examine cabinet 2", "open cabinet 2"]) == "open cabinet 2"
    empty = "You open the cabinet 2. The cabinet 2 is open. In it, you see nothing."
    assert act(empty, goes(here="cabinet 2") + ["close cabinet 2", "examine cabinet 2"]) == "go to cabinet 1"
    # other objects are ignored; the first listed target instance is taken
    seen = "You arrive at countertop 1. On the countertop 1, you see a candle 1, a soapbar 2, and a soapbar 1."
    adm = goes(here="countertop 1") + ["examine countertop 1", "take candle 1 from countertop 1",
                                        "take soapbar 1 from countertop 1", "take soapbar 2 from countertop 1"]
    assert act(seen, adm) == "take soapbar 2 from countertop 1"
    # the last receptacle wraps around to the first
    end = "You arrive at toilet 1. On the toilet 1, you see nothing."
    assert act(end, goes(here="toilet 1") + ["examine toilet 1"]) == "go to cabinet 2"
    # the rule has no hidden state: the same inputs give the same command
    assert act(seen, adm) == act(seen, adm)


def test_search_reaches_receptacles_that_share_the_agents_location():
    goal = parse_goal("put some soapbar on toilet")
    # cabinet 1 shares cabinet 2's location: no "go to cabinet 1"; open it if closed, else examine it
    obs = "You open the cabinet 2. The cabinet 2 is open. In it, you see nothing."
    adm = goes("cabinet 1", here="cabinet 2") + ["examine cabinet 1", "examine cabinet 2", "open cabinet 1"]
    assert search_action(goal, RECEPTACLES, obs, adm) == "open cabinet 1"
    adm = goes("cabinet 1", here="cabinet 2") + ["examine cabinet 1", "examine cabinet 2"]
    assert search_action(goal, RECEPTACLES, obs, adm) == "examine cabinet 1"
    looked = "On the cabinet 1, you see a soapbar 1."
    adm = goes("cabinet 2", here="cabinet 1") + ["examine cabinet 1", "take soapbar 1 from cabinet 1"]
    assert search_action(goal, RECEPTACLES, looked, adm) == "take soapbar 1 from cabinet 1"


def test_carrying_goes_to_the_first_destination_of_the_goal_type_then_puts():
    goal = parse_goal("put a soapbar in cabinet")
    holding = ["examine soapbar 1"]
    taken = "You pick up the soapbar 1 from the countertop 1."
    assert search_action(goal, RECEPTACLES, taken, goes(here="countertop 1") + holding) == "go to cabinet 2"
    closed = "You arrive at cabinet 2. The cabinet 2 is closed."
    adm = goes(here="cabinet 2") + holding + ["examine cabinet 2", "open cabinet 2"]
    assert search_action(goal, RECEPTACLES, closed, adm) == "open cabinet 2"
    opened = "You open the cabinet 2. The cabinet 2 is open. In it, you see nothing."
    adm = goes(here="cabinet 2") + holding + ["examine cabinet 2", "move soapbar 1 to cabinet 2"]
    assert search_action(goal, RECEPTACLES, opened, adm) == "move soapbar 1 to cabinet 2"


def test_a_wrongly_held_object_is_put_down_where_the_agent_is_first():
    # a policy's state (the expert never takes another type): it holds a cloth, the goal is a soapbar
    goal = parse_goal("put some soapbar on toilet")
    holding = ["examine cloth 1"]
    taken = "You pick up the cloth 1 from the countertop 1."
    adm = goes(here="countertop 1") + holding + ["examine countertop 1", "move cloth 1 to countertop 1"]
    assert search_action(goal, RECEPTACLES, taken, adm) == "move cloth 1 to countertop 1"
    # at a closed receptacle it opens it first; where it cannot put it down it walks on
    closed = "You arrive at cabinet 2. The cabinet 2 is closed."
    adm = goes(here="cabinet 2") + holding + ["examine cabinet 2", "open cabinet 2"]
    assert search_action(goal, RECEPTACLES, closed, adm) == "open cabinet 2"
    assert search_action(goal, RECEPTACLES, "Nothing happens.", goes() + holding) == "go to cabinet 2"
    # holding the goal's type is not affected: it goes on to the destination
    soap = ["examine soapbar 1"]
    assert search_action(goal, RECEPTACLES, "You pick up the soapbar 1 from the countertop 1.",
                         goes(here="countertop 1") + soap) == "go to toilet 1"


def test_labelling_a_policys_state_uses_its_place_and_the_receptacles_it_has_visited():
    goal = parse_goal("put some soapbar on toilet")
    # after "Nothing happens." the observation names no place: without `here` the rule starts over
    assert search_action(goal, RECEPTACLES, "Nothing happens.", goes()) == "go to cabinet 2"
    adm = goes(here="cabinet 1") + ["examine cabinet 1"]
    assert search_action(goal, RECEPTACLES, "Nothing happens.", adm, here="cabinet 1",
                         visited=["cabinet 2", "cabinet 1"]) == "go to countertop 1"
    # a policy that skipped countertop 1: the next receptacle is the first one not visited, not the one after here
    there = "You arrive at drawer 1. On the drawer 1, you see a candle 1."
    adm = goes(here="drawer 1") + ["examine drawer 1", "take candle 1 from drawer 1"]
    assert search_action(goal, RECEPTACLES, there, adm) == "go to microwave 1"
    assert search_action(goal, RECEPTACLES, there, adm, visited=["cabinet 2", "cabinet 1", "drawer 1"]) == \
        "go to countertop 1"
    # with everything visited it walks on in the listed order, as without `visited`
    assert search_action(goal, RECEPTACLES, there, adm, visited=RECEPTACLES) == "go to microwave 1"
    # a visible target is still taken first, and the place named by the observation wins over `here`
    seen = "You arrive at countertop 1. On the countertop 1, you see a soapbar 1."
    adm = goes(here="countertop 1") + ["examine countertop 1", "take soapbar 1 from countertop 1"]
    assert search_action(goal, RECEPTACLES, seen, adm, here="cabinet 1", visited=["cabinet 2"]) == \
        "take soapbar 1 from countertop 1"


def test_pick_two_never_takes_back_from_the_destination():
    goal = parse_goal("put two soapbar in toilet")
    placed = "You move the soapbar 1 to the toilet 1."
    assert search_action(goal, RECEPTACLES, placed, goes(here="toilet 1") + ["examine toilet 1"]) == "go to cabinet 2"
    at_dest = "You arrive at toilet 1. On the toilet 1, you see a soapbar 1."
    adm = goes(here="toilet 1") + ["examine toilet 1", "take soapbar 1 from toilet 1"]
    assert search_action(goal, RECEPTACLES, at_dest, adm) == "go to cabinet 2"


def test_heat_goes_to_the_appliance_first_then_to_the_destination():
    goal = parse_goal("heat some egg and put it in countertop")
    holding = ["examine egg 1"]
    taken = "You pick up the egg 1 from the cabinet 1."
    assert search_action(goal, RECEPTACLES, taken, goes(here="cabinet 1") + holding) == "go to microwave 1"
    at = "You arrive at microwave 1. The microwave 1 is closed."
    adm = goes(here="microwave 1") + holding + ["examine microwave 1", "heat egg 1 with microwave 1",
                                                "open microwave 1"]
    assert search_action(goal, RECEPTACLES, at, adm) == "heat egg 1 with microwave 1"
    heated = "You heat the egg 1 using the microwave 1."
    assert search_action(goal, RECEPTACLES, heated, adm) == "go to countertop 1"
    there = "You arrive at countertop 1. On the countertop 1, you see nothing."
    adm = goes(here="countertop 1") + holding + ["examine countertop 1", "move egg 1 to countertop 1"]
    assert search_action(goal, RECEPTACLES, there, adm) == "move egg 1 to countertop 1"


def test_look_uses_the_lamp_once_carrying_and_does_not_open_while_looking_for_it():
    goal = parse_goal("look at soapbar under the desklamp")
    holding = ["examine soapbar 1"]
    closed = "You arrive at drawer 1. The drawer 1 is closed."
    adm = goes(here="drawer 1") + holding + ["examine drawer 1", "open drawer 1"]
    assert search_action(goal, RECEPTACLES, closed, adm) == "go to microwave 1"
    lit = "You arrive at countertop 1. On the countertop 1, you see a desklamp 1."
    adm = goes(here="countertop 1") + holding + ["examine countertop 1", "use desklamp 1"]
    assert search_action(goal, RECEPTACLES, lit, adm) == "use desklamp 1"


# ----- in the engine -----------------------------------------------------------------------------
_MISSING = [m for m in ("alfworld", "textworld", "fast_downward") if importlib.util.find_spec(m) is None]
engine = pytest.mark.skipif(bool(_MISSING), reason=f"ALFWorld engine not installed (missing: {', '.join(_MISSING)})")


@pytest.fixture(scope="module")
def search_games(tmp_path_factory):
    from agentrl_env_alfworld.generate import generate_dataset

    out = str(tmp_path_factory.mktemp("alfworld-search"))
    generate_dataset(out, {"train": 4, "valid_unseen": 2}, seed=3, workers=1, solver="search",
                     task_types=("pick_and_place_simple", "look_at_obj_in_light"), rooms=("bathroom", "bedroom"))
    return out


@engine
def test_search_solver_games_replay_to_a_win_in_small_rooms(search_games):
    import json
    import os

    from agentrl.envs import TaskRef, make_env
    from agentrl_env_alfworld.scenes import room_kind

    env = make_env("alfworld", data_dir=search_games)
    assert env.split_sizes() == {"train": 4, "valid_unseen": 2}
    for split, size in env.split_sizes().items():
        for index in range(size):
            obs, info = env.reset(TaskRef(split, index))
            assert info["task_type"] in ("pick_and_place_simple", "look_at_obj_in_light")
            with open(os.path.join(os.path.dirname(info["gamefile"]), "traj_data.json")) as f:
                assert room_kind(json.load(f)["scene"]["scene_num"]) in ("bathroom", "bedroom")
            expert = SearchExpert(obs, info["task"])
            plan = env.expert_actions()  # the stored walkthrough: the searching expert's episode
            goes_to = [a[len("go to "):] for a in plan if a.startswith("go to ")]
            first_take = next(i for i, a in enumerate(plan) if a.startswith("take "))
            # before it holds the object it only walks the listed receptacles in order
            visited = [a[len("go to "):] for a in plan[:first_take] if a.startswith("go to ")]
            order = [expert.receptacles.index(r) for r in visited]
            assert order == sorted(order) and goes_to
            for action in plan:
                # the policy, re-asked on what the agent sees, gives the stored command back
                assert expert.act(obs, info["admissible_actions"]) == action
                obs, reward, terminated, truncated, info = env.step(action)
            assert info["won"] and terminated and reward == 1.0
    # room_in_task: the prompt's task keeps the receptacle list on every step
    obs, info = make_env("alfworld", data_dir=search_games, room_in_task=True).reset(TaskRef("train", 0))
    room, goal = info["task"].split("\n")
    assert obs.startswith(room + "\n\n") and goal.startswith("Your task is to: ")
    assert listed_receptacles(room)


@engine
def test_unvisited_notes_follow_the_agents_feedback_and_lead_the_searching_expert(search_games):
    from agentrl.envs import TaskRef, make_env

    env = make_env("alfworld", data_dir=search_games, room_in_task=True, unvisited_in_task=True)
    for index in range(4):
        obs, info = env.reset(TaskRef("train", index))
        room, notes, goal = info["task"].split("\n")
        listed = listed_receptacles(room)
        assert notes == f"Not visited yet: {', '.join(listed)}." and goal.startswith("Your task is to: ")
        visited: list[str] = []
        carrying = False
        for action in env.expert_actions():
            left = info["task"].split("\n")[1][len("Not visited yet: "):-1].split(", ")
            assert left == ([r for r in listed if r not in visited] or ["none"])
            if action.startswith("go to ") and not carrying:
                assert action == f"go to {left[0]}"  # searching: the next receptacle is the first not visited
            carrying = carrying or action.startswith("take ")
            obs, reward, terminated, truncated, info = env.step(action)
            here = observed_receptacle(obs)
            if here is not None and here not in visited:
                visited.append(here)
        assert info["won"]
    # off (the default): the task is the same on every step
    plain = make_env("alfworld", data_dir=search_games, room_in_task=True)
    _, first = plain.reset(TaskRef("train", 0))
    _, _, _, _, later = plain.step(plain.expert_actions()[0])
    assert first["task"] == later["task"] and "Not visited" not in first["task"]


@engine
def test_held_notes_follow_pick_up_and_put_down(search_games):
    from agentrl.envs import TaskRef, make_env

    env = make_env("alfworld", data_dir=search_games, room_in_task=True, unvisited_in_task=True, held_in_task=True)
    for index in range(4):
        obs, info = env.reset(TaskRef("train", index))
        room, notes, held, goal = info["task"].split("\n")
        assert notes.startswith("Not visited yet: ") and held == "Carrying: nothing."
        plan = env.expert_actions()
        taken = next(i for i, action in enumerate(plan) if action.startswith("take "))
        obj = plan[taken][len("take "):].split(" from ")[0]
        carrying = False
        for i, action in enumerate(plan):
            obs, reward, terminated, truncated, info = env.step(action)
            # pick tasks put it down with the last action; look tasks win holding it
            carrying = (carrying or i == taken) and not action.startswith("move ")
            assert info["task"].split("\n")[2] == (f"Carrying: {obj}." if carrying else "Carrying: nothing.")
            if i == taken:      # a failed action changes nothing: still carrying
                obs, *_, info = env.step("move soapbar 9 to cabinet 9")
                assert obs.strip() == "Nothing happens." and info["task"].split("\n")[2] == f"Carrying: {obj}."
        assert info["won"]
    # a reset forgets it; without the room line or the visited notes the note sits before the goal
    alone = make_env("alfworld", data_dir=search_games, held_in_task=True)
    _, info = alone.reset(TaskRef("train", 0))
    held, goal = info["task"].split("\n")
    assert held == "Carrying: nothing." and goal.startswith("Your task is to: ")


@engine
def test_env_expert_next_action_labels_the_expert_path_and_a_policys_detours(search_games):
    from agentrl.envs import TaskRef, make_env

    env = make_env("alfworld", data_dir=search_games, room_in_task=True)
    for index in range(4):
        env.reset(TaskRef("train", index))
        plan = env.expert_actions()
        for action in plan:              # on the expert's own episode: its stored walkthrough
            assert env.expert_next_action() == action
            *_, info = env.step(action)
        assert info["won"]
    # a policy's detours: an action that fails changes nothing, so the label stays the same; after a
    # skipped receptacle the label is the first one not yet visited
    unchanged = detours = 0
    for index in range(4):
        obs, info = env.reset(TaskRef("train", index))
        listed = listed_receptacles(obs)
        env.step(env.expert_next_action())   # at the first receptacle
        first = env.expert_next_action()
        for wrong in ("take soapbar 9 from cabinet 9", "go to nowhere 1", "move soapbar 9 to cabinet 9"):
            obs, *_ = env.step(wrong)
            assert obs.strip() == "Nothing happens."
            assert env.expert_next_action() == first
            unchanged += 1
        env.reset(TaskRef("train", index))
        skipped = listed[1]
        obs, *_, info = env.step(f"go to {skipped}")
        assert observed_receptacle(obs) == skipped
        label = env.expert_next_action()
        if label == f"open {skipped}":
            env.step(label)
            label = env.expert_next_action()
        if not label.startswith("take "):    # nothing to take here: back to the receptacle it skipped
            assert label.endswith(listed[0])
            detours += 1
    assert unchanged == 12 and detours >= 1


def test_an_env_without_a_step_wise_expert_says_so():
    from agentrl.envs import TaskRef, make_env

    env = make_env("textcraft")
    env.reset(TaskRef("depth2", 0))
    from agentrl.errors import UsageError

    with pytest.raises(UsageError, match="trainer.sft.dagger.tasks"):
        env.expert_next_action()


@engine
def test_play_search_expert_wins_default_generated_simple_games():
    from agentrl_env_alfworld.engine import load_engine_env
    from agentrl_env_alfworld.expert import play_search_expert
    from agentrl_env_alfworld.generate import generate_game

    for k in range(2):
        game = generate_game(11, "train", k, task_types=("pick_and_place_simple",), rooms=("bathroom",))
        actions, won = play_search_expert(load_engine_env(game["game"]), max_steps=60)
        assert won and actions[-1].startswith("move ")
        assert len(actions) >= len(game["game"]["walkthrough"])  # never shorter than the omniscient plan


@engine
def test_env_kwargs_choose_the_generated_sets_solver_rooms_and_families(tmp_path, monkeypatch):
    import json
    import os

    from agentrl.envs import TaskRef, make_env
    from agentrl_env_alfworld.data import generated_set_key, generation_options
    from agentrl_env_alfworld.scenes import room_kind

    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    counts = {"train": 2, "valid_unseen": 1}
    kwargs = dict(generated_counts=counts, generated_seed=5, generated_solver="search",
                  generated_rooms=["bathroom"], generated_task_types=["pick_and_place_simple"])
    env = make_env("alfworld", **kwargs)
    assert env.data_dir.startswith(str(tmp_path)) and env.split_sizes() == counts
    with open(os.path.join(env.data_dir, "COMPLETE")) as f:
        assert json.load(f)["solver"] == "search"
    for split, size in counts.items():
        for index in range(size):
            obs, info = env.reset(TaskRef(split, index))
            assert info["task_type"] == "pick_and_place_simple"
            with open(os.path.join(os.path.dirname(info["gamefile"]), "traj_data.json")) as f:
                assert room_kind(json.load(f)["scene"]["scene_num"]) == "bathroom"
            expert = SearchExpert(obs, info["task"])
            for action in env.expert_actions():  # the stored walkthrough is the searching expert's
                assert expert.act(obs, info["admissible_actions"]) == action
                obs, reward, terminated, truncated, info = env.step(action)
            assert info["won"]
    # the same kwargs find the same set; defaults keep the key sets had before these options existed
    assert make_env("alfworld", **kwargs).data_dir == env.data_dir
    assert generated_set_key(counts, 5) == generated_set_key(counts, 5, generation_options())
    assert os.path.basename(env.data_dir) != generated_set_key(counts, 5)
    for bad, key in ((dict(generated_solver="oracle"), "generated_solver"),
                     (dict(generated_rooms=["garage"]), "generated_rooms"),
                     (dict(generated_task_types=["pick_three"]), "generated_task_types")):
        with pytest.raises(ValueError, match=key):
            make_env("alfworld", generated_counts=counts, **bad)
