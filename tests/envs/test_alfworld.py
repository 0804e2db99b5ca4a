"""ALFWorld on the real alfworld/TextWorld engine: generated games, expert, protocol, pool.

Games are generated once per module (one per task type in train, two in valid_unseen) into a
temporary directory; every test plays them through the real engine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
import sys

import pytest

from agentrl.envs import REQUIRED_INFO_KEYS, TaskRef, make_env
from agentrl_env_alfworld.tasks import (
    TASK_TYPE_SHORT_NAMES, TASK_TYPES, VALID_UNSEEN_SCENES, list_split_games, short_task_type)

_MISSING = [m for m in ("alfworld", "textworld", "fast_downward") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"ALFWorld engine not installed (missing: "
                                f"{', '.join(_MISSING)}); `pip install alfworld`")

GOAL_PATTERNS = {
    "pick_and_place_simple": r"put a (\w+) in (\w+)|put some (\w+) on (\w+)",
    "look_at_obj_in_light": r"look at (\w+) under the (\w+)|examine the (\w+) with the (\w+)",
    "pick_clean_then_place_in_recep": r"put a clean (\w+) in (\w+)|clean some (\w+) and put it in (\w+)",
    "pick_heat_then_place_in_recep": r"put a hot (\w+) in (\w+)|heat some (\w+) and put it in (\w+)",
    "pick_cool_then_place_in_recep": r"put a cool (\w+) in (\w+)|cool some (\w+) and put it in (\w+)",
    "pick_two_obj_and_place": r"put two (\w+) in (\w+)|find two (\w+) and put them in (\w+)",
}
NAME = r"[a-z]+ \d+"
FEEDBACK = [  # (command pattern, feedback pattern), as the 0.4.x grammar prints them
    (rf"go to ({NAME})", r"You arrive at {0}\. (On the {0}, you see (nothing|a .+)\.|The {0} is closed\.|"
                         r"The {0} is open\. In it, you see (nothing|a .+)\.)"),
    (rf"open ({NAME})", r"You open the {0}\. The {0} is open\. In it, you see (nothing|a .+)\."),
    (rf"close ({NAME})", r"You close the {0}\."),
    (rf"take ({NAME}) from ({NAME})", r"You pick up the {0} from the {1}\."),
    (rf"move ({NAME}) to ({NAME})", r"You move the {0} to the {1}\."),
    (rf"heat ({NAME}) with ({NAME})", r"You heat the {0} using the {1}\."),
    (rf"cool ({NAME}) with ({NAME})", r"You cool the {0} using the {1}\."),
    (rf"clean ({NAME}) with ({NAME})", r"You clean the {0} using the {1}\."),
    (rf"use ({NAME})", r"You turn (on|off) the {0}\."),
    (r"inventory", r"You are carrying: a [a-z]+ \d+\.|You are not carrying anything\."),
    (r"look", r"You are in the middle of a room\. Looking quickly around you, you see .+\.|"
              r"You are facing the .+\. Next to it, you see .+\."),
    (rf"examine ({NAME})", r".+"),
]


def check_feedback(command: str, feedback: str) -> None:
    for cmd_pat, fb_pat in FEEDBACK:
        m = re.fullmatch(cmd_pat, command)
        if m:
            pattern = fb_pat.format(*(re.escape(g) for g in m.groups()))
            assert re.fullmatch(pattern, feedback, flags=re.S), (command, feedback)
            return
    assert command == "help" and "Available commands:" in feedback, (command, feedback)


def goal_satisfied(task_type: str, params: dict, facts, entity_infos) -> bool:
    """The task's PDDL goal, evaluated independently on the engine's current facts."""
    def name(v):
        return entity_infos[v.name].name.strip() if v.name in entity_infos else v.name

    rel: dict[str, set] = {}
    for f in facts:
        rel.setdefault(f.name.lower(), set()).add(tuple(name(a) for a in f.arguments))
    otype = {o: t for o, t in rel.get("objecttype", ())}
    rtype = {r: t for r, t in rel.get("receptacletype", ())}
    want_o = f"{params['object_target']}type".lower()
    if task_type == "look_at_obj_in_light":
        want_l = f"{params['toggle_target']}type".lower()
        at = {loc for _, loc in rel.get("atlocation", ())}
        lit = any(otype.get(lamp) == want_l and (lamp,) in rel.get("istoggled", ()) and
                  any(r2 == r and loc in at for r2, loc in rel.get("receptacleatlocation", ()))
                  for lamp, r in rel.get("inreceptacle", ()))
        holds = any(otype.get(o) == want_o for _, o in rel.get("holds", ()))
        return lit and holds
    want_r = f"{params['parent_target']}type".lower()
    state = {"pick_clean_then_place_in_recep": "isclean", "pick_heat_then_place_in_recep": "ishot",
             "pick_cool_then_place_in_recep": "iscool"}.get(task_type)
    per_recep: dict[str, int] = {}
    for o, r in rel.get("inreceptacle", ()):
        if otype.get(o) == want_o and rtype.get(r) == want_r and (state is None or (o,) in rel.get(state, ())):
            per_recep[r] = per_recep.get(r, 0) + 1
    need = 2 if task_type == "pick_two_obj_and_place" else 1
    return any(n >= need for n in per_recep.values())


@pytest.fixture(scope="module")
def games_dir(tmp_path_factory):
    from agentrl_env_alfworld.generate import generate_dataset

    out = str(tmp_path_factory.mktemp("alfworld"))
    generate_dataset(out, {"train": len(TASK_TYPES), "valid_unseen": 2}, seed=7, workers=2)
    return out


@pytest.fixture(scope="module")
def env(games_dir):
    return make_env("alfworld", data_dir=games_dir)


def test_generated_games_use_the_official_layout(games_dir):
    from agentrl_env_alfworld.scenes import game_logic

    train = list_split_games(games_dir, "train")
    assert len(train) == len(TASK_TYPES)
    seen_types = set()
    for path in train + list_split_games(games_dir, "valid_unseen"):
        trial = os.path.dirname(path)
        task_dir = os.path.basename(os.path.dirname(trial))
        assert os.path.basename(trial).startswith("trial_")
        with open(os.path.join(trial, "traj_data.json")) as f:
            traj = json.load(f)
        with open(path) as f:
            game = json.load(f)
        p = traj["pddl_params"]
        second = p["toggle_target"] if traj["task_type"] == "look_at_obj_in_light" else p["parent_target"]
        assert task_dir == (f"{traj['task_type']}-{p['object_target']}-{p['mrecep_target']}-{second}-"
                            f"{traj['scene']['scene_num']}")
        assert game["solvable"] is True and game["walkthrough"]
        assert game["pddl_domain"] == game_logic()["pddl_domain"]
        assert "UNKNOWN GOAL" not in game["grammar"]
        assert traj["turk_annotations"]["anns"][0]["task_desc"]
        unseen = "/valid_unseen/" in path
        assert (traj["scene"]["scene_num"] in VALID_UNSEEN_SCENES) == unseen
        if not unseen:
            seen_types.add(traj["task_type"])
    assert seen_types == set(TASK_TYPES)


def test_generation_is_deterministic(games_dir):
    from agentrl_env_alfworld.generate import generate_game

    again = generate_game(7, "valid_unseen", 1)
    trial = os.path.join(games_dir, "json_2.1.1", "valid_unseen", again["task_dir"], again["trial_dir"])
    with open(os.path.join(trial, "game.tw-pddl")) as f:
        assert json.load(f) == again["game"]


def test_expert_wins_every_task_type_with_protocol_text(env):
    assert env.max_steps == 50
    assert env.split_sizes() == {"train": len(TASK_TYPES), "valid_unseen": 2}
    types = set()
    for index in range(env.split_sizes()["train"]):
        obs, info = env.reset(TaskRef("train", index))
        assert set(REQUIRED_INFO_KEYS) <= set(info)
        assert info["depth"] is None and info["won"] is False
        assert info["task_type_short"] == short_task_type(info["task_type"])
        types.add(info["task_type"])
        # initial observation: banner stripped, room overview, then the task line
        assert not obs.startswith("-= Welcome")
        room, task = obs.split("\n\n")
        assert re.fullmatch(r"You are in the middle of a room\. Looking quickly around you, you see "
                            r"(a [a-z]+ \d+, )+and a [a-z]+ \d+\.", room), room
        assert task == info["task"] and task.startswith("Your task is to: ") and task.endswith(".")
        assert re.fullmatch(GOAL_PATTERNS[info["task_type"]], task[len("Your task is to: "):-1])
        adm = info["admissible_actions"]
        assert adm == sorted(set(adm)) and {"help", "inventory", "look"} <= set(adm)
        assert all(re.fullmatch(r"go to [a-z]+ \d+|help|inventory|look", a) for a in adm)
        plan = env.expert_actions()
        for step, action in enumerate(plan):
            assert action in info["admissible_actions"]
            obs, reward, terminated, truncated, info = env.step(action)
            check_feedback(action, obs)
            last = step == len(plan) - 1
            assert info["won"] is last and terminated is last and reward == (1.0 if last else 0.0)
            assert truncated is False
    assert types == set(TASK_TYPES)


def test_fixed_commands_and_invalid_actions(env):
    obs, info = env.reset(TaskRef("valid_unseen", 0))
    assert info["noop"] is False
    for command, expected in [("jump", "Nothing happens."), ("Go to the moon", "Nothing happens."),
                              ("inventory", "You are not carrying anything.")]:
        obs, reward, terminated, truncated, info = env.step(command)
        assert obs == expected and reward == 0.0 and not terminated
        assert info["noop"] is (expected == "Nothing happens.")
    obs, *_ , info = env.step("look")
    check_feedback("look", obs)
    assert info["noop"] is False
    obs, *_ = env.step("help")
    assert "go to (receptacle):" in obs and "move (object) to (receptacle):" in obs
    plan = env.expert_actions()
    take = next(i for i, a in enumerate(plan) if a.startswith("take "))
    for action in plan[: take + 1]:
        env.step(action)
    obs, *_ = env.step("inventory")
    assert obs == f"You are carrying: a {plan[take].split(' from ')[0][len('take '):]}."
    env_raw = make_env("alfworld", data_dir=env.data_dir, strip_banner=False)
    raw, _ = env_raw.reset(TaskRef("valid_unseen", 0))
    assert raw.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")


def test_random_admissible_play_wins_only_when_the_goal_holds(env):
    rng = random.Random(0)
    for index in (0, 1):
        _, info = env.reset(TaskRef("valid_unseen", index))
        traj = env._traj
        for _ in range(25):
            action = rng.choice([a for a in info["admissible_actions"] if a != "help"])
            obs, reward, terminated, truncated, info = env.step(action)
            check_feedback(action, obs)
            state = env._state
            assert info["won"] == goal_satisfied(traj["task_type"], traj["pddl_params"],
                                                 state["_facts"], state["_entity_infos"])
            assert reward == (1.0 if info["won"] else 0.0) and terminated == info["won"]
            if terminated:
                break


def test_step_limit_truncates(games_dir):
    env = make_env("alfworld", data_dir=games_dir, max_steps=3)
    env.reset(TaskRef("train", 0))
    flags = [env.step("look")[3] for _ in range(3)]
    assert flags == [False, False, True]


def test_official_directory_from_alfworld_data(games_dir, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", games_dir)
    env = make_env("alfworld")
    assert env.data_dir == games_dir
    obs, info = env.reset(TaskRef("valid_unseen", 1))
    for action in env.expert_actions():
        obs, reward, terminated, truncated, info = env.step(action)
    assert info["won"] and terminated


def test_process_pool_plays_experts(games_dir):
    from agentrl_env_alfworld.pool import ALFWorldPool

    with ALFWorldPool(2, workers=2, data_dir=games_dir) as pool:
        first = pool.reset({0: TaskRef("train", 2), 1: TaskRef("train", 3)})
        assert {i: info["index"] for i, (_, info) in first.items()} == {0: 2, 1: 3}
        plans = pool.expert_actions([0, 1])
        won = {}
        for step in range(max(len(p) for p in plans.values())):
            actions = {i: p[step] for i, p in plans.items() if step < len(p)}
            for i, (_, _, terminated, _, info) in pool.step(actions).items():
                won[i] = info["won"]
        assert won == {0: True, 1: True}


def test_package_import_is_light_and_cli_parses_generate():
    code = ("import sys, agentrl_env_alfworld as a; assert 'textworld' not in sys.modules; "
            "assert a.TASK_TYPE_SHORT_NAMES['pick_two_obj_and_place'] == 'Pick2'")
    subprocess.run([sys.executable, "-c", code], check=True)
    import argparse

    from agentrl_env_alfworld.cli import add_cli, run_generate

    parser = argparse.ArgumentParser(prog="agentrl envs")
    add_cli(parser.add_subparsers(dest="envs_command"))
    args = parser.parse_args(["alfworld", "generate", "--out", "x", "--n", "12", "--seed", "3"])
    assert (args.out, args.n, args.seed, args._envs_run) == ("x", 12, 3, run_generate)
    assert sorted(TASK_TYPE_SHORT_NAMES.values()) == sorted(["Pick", "Look", "Clean", "Heat", "Cool", "Pick2"])


def _play_texts(games_dir: str) -> list[str]:
    """Every observation, admissible list and win flag of seeded random and expert episodes."""
    env = make_env("alfworld", data_dir=games_dir)
    rng = random.Random(3)
    texts = []
    for split, n in (("train", len(TASK_TYPES)), ("valid_unseen", 2)):
        for index in range(n):
            for policy in ("random", "expert"):
                obs, info = env.reset(TaskRef(split, index))
                texts.append(obs + "\n" + "|".join(info["admissible_actions"]))
                actions = env.expert_actions() if policy == "expert" else None
                for t in range(12):
                    action = actions[t] if actions else rng.choice(info["admissible_actions"])
                    obs, reward, terminated, truncated, info = env.step(action)
                    texts.append(f"{obs}\n{'|'.join(info['admissible_actions'])}\n{info['won']} {reward}")
                    if terminated or truncated or (actions and t + 1 == len(actions)):
                        break
    return texts


def test_engine_caches_leave_every_text_unchanged(games_dir, monkeypatch):
    import fast_downward
    import textworld.envs.pddl.textgen as textgen

    from agentrl_env_alfworld import engine_caches

    shipped = textgen.copy_context
    engine_caches.uninstall_engine_caches()
    monkeypatch.setenv(engine_caches.ENV_SWITCH, "0")
    try:
        assert not engine_caches.install_engine_caches()
        plain = _play_texts(games_dir)
        assert not engine_caches.engine_caches_installed()
        shipped = textgen.copy_context
        monkeypatch.setenv(engine_caches.ENV_SWITCH, "1")
        monkeypatch.setattr(sys, "argv", ["a-training-script", "--its-option"])
        # TextWorld's memo emptied before every game load: the texts must not change
        monkeypatch.setattr(engine_caches, "MEMO_LIMIT", 0)
        emptied = []
        bound = engine_caches.bound_textworld_memo
        monkeypatch.setattr(engine_caches, "bound_textworld_memo", lambda: emptied.append(bound()))
        cached = _play_texts(games_dir)        # loading the first engine env installs them
        assert emptied.count(True) >= 2 * len(TASK_TYPES), emptied
        # fast_downward's translation sets sys.argv for its own option parser; the cache gives it back
        assert sys.argv == ["a-training-script", "--its-option"]
        assert engine_caches.engine_caches_installed()
        assert textgen.copy_context is not shipped
        assert fast_downward.pddl2sas.__name__ == "pddl2sas" and fast_downward.pddl2sas.__module__ == engine_caches.__name__
    finally:
        engine_caches.install_engine_caches()
    assert len(plain) > 100
    assert cached == plain
    # a context copy is a new pair of dicts: what one derivation adds never reaches another
    context = {"state": None, "facts": [], "variables": {"a": 1}, "mapping": {"p": "v"}, "entity_infos": {}}
    copy = textgen.copy_context(context)
    copy["variables"]["b"] = 2
    copy["mapping"]["q"] = "w"
    assert context["variables"] == {"a": 1} and context["mapping"] == {"p": "v"}
    engine_caches.uninstall_engine_caches()
    assert textgen.copy_context is shipped
    engine_caches.install_engine_caches()


def test_engine_memory_stays_bounded_over_many_games(games_dir, monkeypatch):
    """A process that meets many distinct games keeps every cache and TextWorld's memo under its
    bound (without the bounds the memo and the parser models grew with every game)."""
    import mementos.core

    from agentrl_env_alfworld import engine_caches

    engine_caches.uninstall_engine_caches()
    monkeypatch.setattr(engine_caches, "MODEL_CACHE_SIZE", 3)
    monkeypatch.setattr(engine_caches, "QUERY_CACHE_SIZE", 3)
    monkeypatch.setattr(engine_caches, "PDDL2SAS_CACHE_SIZE", 2)
    monkeypatch.setattr(engine_caches, "MEMO_LIMIT", 500)
    env = make_env("alfworld", data_dir=games_dir)
    peak: dict[str, int] = {}
    memo_sizes = []
    try:
        for split, n in (("train", len(TASK_TYPES)), ("valid_unseen", 2)):
            for index in range(n):
                env.reset(TaskRef(split, index))
                env.step("look")
                sizes = engine_caches.engine_cache_sizes()
                memo_sizes.append(sizes["textworld_memo"])
                for name, size in sizes.items():
                    peak[name] = max(peak.get(name, 0), size)
        assert peak["pddl_logic._parse_and_convert"] <= 3 and peak["textgen._parse_and_convert"] <= 3
        assert peak["fast_downward.pddl2sas"] <= 2 and peak["Rule.parse_conjunctive_query"] <= 3
        # the memo filled past its bound, was emptied at the next load, and never held more than
        # the bound plus what one game adds
        one_game = max(b - a for a, b in zip([0] + memo_sizes, memo_sizes))
        assert any(b < a for a, b in zip(memo_sizes, memo_sizes[1:])), memo_sizes
        assert max(memo_sizes) <= 500 + one_game, memo_sizes
    finally:
        engine_caches.uninstall_engine_caches()
        engine_caches.install_engine_caches()
