"""The cheaper ALFWorld reset (envs/alfworld/agentrl_env_alfworld/engine_reset.py) on the real engine.

Each test builds the engine's states both ways, TextWorld's ``PddlState.__init__`` as shipped (the
engine caches uninstalled) and the replacement, and checks that the replacement did less work (one
translation per game, the library's initial state read once per translated task, a library copy
without debug sections, the collector held off) for the same state, and that envs on several
threads play as on one (the engine lock). Two bathroom pick-and-place games, made once
per module.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import threading

import pytest

_MISSING = [m for m in ("alfworld", "textworld", "fast_downward") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"ALFWorld engine not installed (missing: "
                                f"{', '.join(_MISSING)}); `pip install alfworld`")


@pytest.fixture(scope="module")
def games(tmp_path_factory) -> list[dict]:
    from agentrl_env_alfworld.generate import generate_dataset
    from agentrl_env_alfworld.tasks import list_split_games

    out = str(tmp_path_factory.mktemp("alfworld_reset"))
    generate_dataset(out, {"train": 2}, seed=5, workers=1, task_types=("pick_and_place_simple",),
                     rooms=("bathroom",))
    paths = list_split_games(out, "train")
    assert len(paths) == 2
    games = []
    for path in paths:
        with open(path) as f:
            games.append({**json.load(f), "path": path, "data_dir": out})
    return games


@pytest.fixture
def shipped_engine():
    """TextWorld and Fast Downward as shipped inside the ``with`` block, the engine caches after."""
    from agentrl_env_alfworld import engine_caches

    engine_caches.uninstall_engine_caches()
    yield engine_caches
    engine_caches.uninstall_engine_caches()
    engine_caches.install_engine_caches()


def _state(game: dict, downward_lib):
    from textworld.envs.pddl.logic import GameLogic, PddlState

    return PddlState(downward_lib, game["pddl_problem"], GameLogic(game["pddl_domain"], game["grammar"]))


def _contents(state) -> dict:
    """Everything a ``PddlState`` holds that play reads, in the order it iterates."""
    return {"facts": list(state.facts), "signatures": list(state._facts),
            "vars_by_name": list(state._vars_by_name.items()),
            "vars_by_type": {t: sorted(v.name for v in vs) for t, vs in state._vars_by_type.items()},
            "var_counts": dict(state._var_counts), "name2type": state.name2type, "sas": state.sas,
            "actions": sorted(state._actions), "types": sorted(state._logic.types._types),
            "problem": state.pddl_problem}


class _CountingLibrary:
    """A Fast Downward library whose ``get_state`` (reading the initial state back) is counted."""

    def __init__(self, library):
        self.library, self.get_state_calls = library, 0

    def __getattr__(self, name):
        return getattr(self.library, name)

    def get_state(self, atoms):
        self.get_state_calls += 1
        return self.library.get_state(atoms)


def test_state_is_the_shipped_one_and_reads_the_initial_facts_once_per_translated_task(games, shipped_engine,
                                                                                       monkeypatch):
    """The replacement ``PddlState.__init__`` gives the shipped state (facts in the same iteration
    order: the grammar's texts follow it), reads the library's initial state once per translated
    task, keeps at most ``INITIAL_FACTS_CACHE_SIZE`` of them, and a task translated anew (its
    translation evicted) is read again rather than matched to the old one."""
    import fast_downward

    from agentrl_env_alfworld import engine_caches, engine_reset

    a, b = games
    library = fast_downward.load_lib()
    try:
        shipped = {id(g): _contents(_state(g, library)) for g in games}
        monkeypatch.setattr(engine_caches, "PDDL2SAS_CACHE_SIZE", 1)
        monkeypatch.setattr(engine_reset, "INITIAL_FACTS_CACHE_SIZE", 2)
        assert engine_caches.install_engine_caches()
        counting = _CountingLibrary(library)
        reads = []
        for game in (a, a, b, a):       # a's second translation (after b's evicted it) is a new task
            state = _state(game, counting)
            assert _contents(state) == shipped[id(game)]
            assert isinstance(state.sas_replan, engine_reset.DeferredTranslation) and state.sas_replan == ""
            reads.append(counting.get_state_calls)
            assert engine_caches.engine_cache_sizes()["PddlState.__init__"] <= 2
        assert reads == [1, 1, 2, 3]
    finally:
        fast_downward.close_lib(library)


def test_a_reset_translates_once_and_the_planner_plans_as_shipped(games, shipped_engine, monkeypatch):
    """An engine env's load and reset of a new game make one translation (the shipped engine makes
    four, two of them optimised for the planner); asking for the planner's plan makes the optimised
    one then, and the plans along an episode are the shipped engine's."""
    import fast_downward

    from agentrl_env_alfworld.engine import load_engine_env

    game = games[0]
    translations = []
    translate = fast_downward.pddl2sas

    def plans(policy_commands: bool) -> list:
        env = load_engine_env(game["path"], policy_commands=policy_commands)
        state = env.reset()
        seen = [state.get("policy_commands")]
        for command in game["walkthrough"][:3]:
            state, _, _ = env.step(command)
            seen.append(state.get("policy_commands"))
        return seen

    def counted(domain, problem, verbose=False, optimize=False):
        translations.append(bool(optimize))
        return translate(domain, problem, verbose=verbose, optimize=optimize)

    monkeypatch.setenv(shipped_engine.ENV_SWITCH, "0")      # load_engine_env installs nothing
    fast_downward.pddl2sas = counted                        # as shipped, every call translates
    try:
        shipped = plans(policy_commands=True)
        translations.clear()
        load_engine_env(game["path"]).reset()
        assert translations == [False, True, False, True]
    finally:
        fast_downward.pddl2sas = translate
    assert shipped[0]

    monkeypatch.setenv(shipped_engine.ENV_SWITCH, "1")
    assert shipped_engine.install_engine_caches()
    cached_translation = fast_downward.pddl2sas
    misses = cached_translation.cache_info().misses
    env = load_engine_env(game["path"])
    env.reset()
    assert cached_translation.cache_info().misses == misses + 1
    assert plans(policy_commands=True) == shipped
    assert cached_translation.cache_info().misses == misses + 2     # the planner's translation, once


def test_library_copies_come_from_the_file_without_debug_sections(games, shipped_engine):
    """Engine envs copy Fast Downward's library from a file cut after its loaded segments (1.1 of
    33.8 MB): it loads, and plays."""
    import fast_downward
    import fast_downward.interface as downward_interface

    from agentrl_env_alfworld.engine_reset import loadable_extent, strip_to_loaded_segments

    shipped_path = downward_interface.DOWNWARD_LIB_PATH
    with open(shipped_path, "rb") as f:
        shipped = f.read()
    shipped_engine.install_engine_caches()
    path = downward_interface.DOWNWARD_LIB_PATH
    assert path != shipped_path and os.path.getsize(path) < len(shipped) / 10
    with open(path, "rb") as f:
        assert f.read() == strip_to_loaded_segments(shipped)
    assert shipped[:loadable_extent(shipped)][64:] == strip_to_loaded_segments(shipped)[64:]   # all but the ELF header
    library = fast_downward.load_lib()
    try:
        state = _state(games[0], library)
        assert library.get_applicable_operators_count() > 0 and not state.check_goal()
    finally:
        fast_downward.close_lib(library)
    with pytest.raises(ValueError):
        strip_to_loaded_segments(b"#!/bin/sh\n")


def test_collector_is_held_off_while_any_thread_loads_a_game():
    """The collector is off while any thread is inside ``collector_paused`` and back on when the
    last one leaves (a pause that ends before another's must not turn it back on); left off if it
    was off."""
    from agentrl_env_alfworld.engine_reset import collector_paused

    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other_reset():
        with collector_paused():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other_reset)
    thread.start()
    inside.wait(10)
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()           # the other thread is still inside
    leave.set()
    thread.join(10)
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_envs_on_two_threads_play_as_on_one(games, shipped_engine, monkeypatch):
    """TextWorld's parsers and Fast Downward's translator are process-wide, so envs stepped on two
    threads at once (an env server pool hands the rest of a batch to another thread past a slow
    call) corrupted each other's parses; with the engine lock they play the texts one thread plays.
    The engine as shipped (no caches) parses on every load and step: the most parses to race."""
    from agentrl.envs import TaskRef, make_env

    monkeypatch.setenv(shipped_engine.ENV_SWITCH, "0")
    def play(index: int, texts: list) -> None:
        env = make_env("alfworld", data_dir=games[index]["data_dir"])
        try:
            for _ in range(2):
                obs, info = env.reset(TaskRef("train", index))
                texts.append(obs)
                for action in ["look", *games[index]["walkthrough"][:2]]:
                    texts.append(env.step(action)[0])
        except Exception as err:  # noqa: BLE001 - what the other thread's parse did to this one
            texts.append(f"{type(err).__name__}: {err}")

    alone = [[], []]
    for index in (0, 1):
        play(index, alone[index])
    together = [[], []]
    threads = [threading.Thread(target=play, args=(index, together[index])) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert together == alone
