"""Offline generation of ALFWorld games in the official on-disk format.

The official games are built from ALFRED trajectories recorded in the AI2-THOR simulator; neither
the simulator nor those trajectories are available offline. This module builds the same kind of
``initial_state.pddl`` problem (the structure of ALFWorld's ``augment_pddl_states`` script) from
what the ``alfworld`` package ships:

* ``gen/layouts/FloorPlan<N>-openable.json``: the receptacle instances of each iTHOR scene, with the
  agent pose used to interact with each (that pose becomes the receptacle's PDDL location);
* ``gen/layouts/FloorPlan<N>-objects.json``: the object types present in the scene;
* ``gen/layouts/FloorPlan<N>-layout.npy``: the reachable floor points (the agent's start);
* ``gen/constants.py``: which receptacle types can hold which objects (``VAL_RECEPTACLE_OBJECTS``),
  which objects can be cleaned, heated, cooled, toggled, which receptacles open;
* ``gen/goal_library.py``: the PDDL goal and the goal-text templates of every task type;
* ``data/alfred.pddl`` and ``data/alfred.twl2``: the domain and the text grammar.

Each game is then loaded by TextWorld's ``PddlEnv`` and solved, by default with the omniscient
expert of :mod:`agentrl_env_alfworld.expert` (the engine's Fast Downward planner is available with
``solver="planner"`` but takes minutes on the larger scenes); the walkthrough is replayed in the
engine to a win before the game is written, so every stored game is solvable.
Generation is deterministic: game ``i`` of split ``s`` depends only on ``(seed, s, i)``, so it
runs on any number of processes and resumes after an interruption (:func:`generate_games`).

The scenes are read in :mod:`agentrl_env_alfworld.scenes`, a task's PDDL problem is built in
:mod:`agentrl_env_alfworld.problems`; this module solves the games and writes them.
"""

from __future__ import annotations

import json
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from agentrl_env_alfworld.problems import build_problem, goal_text, sample_task
from agentrl_env_alfworld.scenes import game_logic, load_scene, scene_numbers
from agentrl_env_alfworld.tasks import DATA_SUBDIR, GAME_FILE, SPLITS, TASK_TYPES, TRAJ_FILE

GENERATOR_VERSION = 1
SOLVERS = ("expert", "planner", "search")
# solver="search": the searching expert must win within this many steps (ALFWorld's episode limit)
SEARCH_SOLVER_MAX_STEPS = 50


# ----- solving and writing -----------------------------------------------------------------------
def solve_game(gamedata: dict, task_type: str, params: dict, solver: str = "expert") -> list[str] | None:
    """A walkthrough that wins the game when replayed in the engine, else None.

    ``solver="expert"`` plans with :mod:`agentrl_env_alfworld.expert` (fast); ``"planner"`` asks
    the engine's Fast Downward planner (minutes on large scenes). Either way the plan is replayed
    command by command, each one checked against the admissible list, and must end in a win.
    ``solver="search"`` plays the searching expert (:func:`~agentrl_env_alfworld.expert.search_action`,
    no hidden information) in the engine and keeps its commands if it wins within
    ``SEARCH_SOLVER_MAX_STEPS`` steps.
    """
    from agentrl_env_alfworld.expert import expert_plan, play_search_expert

    env = _solving_engine(gamedata, policy_commands=(solver == "planner"))
    if solver == "search":
        actions, won = play_search_expert(env, SEARCH_SOLVER_MAX_STEPS)
        return actions if won else None
    state = env.reset()
    if solver == "planner":
        plan = list(state.get("policy_commands") or [])
    else:
        plan = expert_plan(task_type, params, state["_facts"], state["_entity_infos"])
    if not plan:
        return None
    for command in plan:
        if command not in state["admissible_commands"]:
            return None
        state, _, _ = env.step(command)
    return plan if state["won"] else None


_solving_engines: dict[bool, object] = {}     # policy_commands -> this process's engine env


def _solving_engine(gamedata: dict, policy_commands: bool):
    """This process's engine env with ``gamedata`` loaded: one per process, reloaded per game. Each
    new engine env loads a private copy of Fast Downward's library that is never unloaded (~3 MB
    with its task), so a worker making an env per game grew by that much per game."""
    from agentrl_env_alfworld.engine import load_engine_env, load_game

    env = _solving_engines.get(policy_commands)
    if env is None:
        env = _solving_engines[policy_commands] = load_engine_env(gamedata, policy_commands=policy_commands)
    else:
        load_game(env, gamedata)
    return env


def generate_game(seed: int, split: str, index: int, solver: str = "expert", max_tries: int = 20,
                  task_types: tuple[str, ...] | None = None, rooms: tuple[str, ...] | None = None) -> dict:
    """Game ``index`` of ``split``: traj data, game file content and its directory names.

    ``task_types`` (default: all six) are dealt round-robin over the indices; ``rooms`` restricts
    the scenes to those room kinds. With both left at None the games are the default set's.
    """
    task_types = tuple(task_types) if task_types else TASK_TYPES
    if set(task_types) - set(TASK_TYPES):
        raise ValueError(f"unknown task types {sorted(set(task_types) - set(TASK_TYPES))}; choose from {TASK_TYPES}")
    task_type = task_types[index % len(task_types)]
    scenes = scene_numbers(split, tuple(rooms) if rooms else None)
    if not scenes:
        raise ValueError(f"no {split} scenes of room kinds {rooms}")
    for attempt in range(max_tries):
        rng = random.Random(f"agentrl-alfworld-{GENERATOR_VERSION}-{seed}-{split}-{index}-{attempt}")
        scene = load_scene(rng.choice(scenes))
        params = sample_task(task_type, scene, rng)
        if params is None:
            continue
        task_id = trial_name(seed, split, index)
        problem = build_problem(task_id, task_type, params, scene, rng)
        goal = goal_text(task_type, params, rng)
        logic = game_logic()
        gamedata = {"pddl_domain": logic["pddl_domain"],
                    "grammar": logic["grammar"].replace("UNKNOWN GOAL", goal),
                    "pddl_problem": problem, "solvable": None, "walkthrough": None}
        plan = solve_game(gamedata, task_type, params, solver)
        if plan is None:
            continue
        gamedata.update(solvable=True, walkthrough=plan)
        second = params["toggle_target"] if task_type == "look_at_obj_in_light" else params["parent_target"]
        task_dir = f"{task_type}-{params['object_target']}-{params['mrecep_target']}-{second}-{scene.number}"
        traj = {"task_id": task_id, "task_type": task_type, "pddl_params": params,
                "scene": {"floor_plan": f"FloorPlan{scene.number}", "scene_num": scene.number},
                "turk_annotations": {"anns": [{"task_desc": goal[0].upper() + goal[1:] + ".",
                                               "assignment_id": "generated", "high_descs": []}]},
                "plan": {"high_pddl": [{"discrete_action": {"action": cmd}} for cmd in plan]},
                "generated_by": {"generator": "agentrl_env_alfworld.generate",
                                 "version": GENERATOR_VERSION, "seed": seed}}
        return {"split": split, "task_dir": task_dir, "trial_dir": task_id, "traj": traj, "game": gamedata}
    raise RuntimeError(f"could not generate a solvable {task_type} game for {split}[{index}] "
                       f"after {max_tries} attempts")


MANIFEST_FILE = "agentrl-generate.json"  # the recipe of a generated directory, at its root
_TMP_SUFFIX = ".partial"


def trial_name(seed: int, split: str, index: int) -> str:
    """The trial directory name of game ``index`` of ``split`` (it names the game for resuming)."""
    return f"trial_S{seed}_{split}_{index:06d}"


def _write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (or a killed writer) never sees half of it."""
    tmp = f"{path}.{os.getpid()}{_TMP_SUFFIX}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _generate_and_write(out: str, seed: int, split: str, index: int, solver: str,
                        task_types: tuple[str, ...] | None = None, rooms: tuple[str, ...] | None = None) -> str:
    game = generate_game(seed, split, index, solver, task_types=task_types, rooms=rooms)
    trial = os.path.join(out, DATA_SUBDIR, split, game["task_dir"], game["trial_dir"])
    os.makedirs(trial, exist_ok=True)
    _write_atomic(os.path.join(trial, TRAJ_FILE), json.dumps(game["traj"], indent=1))
    # the game file goes last: its presence marks the game finished (see finished_games)
    _write_atomic(os.path.join(trial, GAME_FILE), json.dumps(game["game"]))
    return trial


def finished_games(out: str, seed: int, split: str) -> dict[int, str]:
    """``{index: trial dir}`` of the games of ``split`` already written under ``out`` (both files
    present); leftovers of interrupted writes (``*.partial``) are removed on the way."""
    base = os.path.join(out, DATA_SUBDIR, split)
    prefix = trial_name(seed, split, 0)[:-6]
    done: dict[int, str] = {}
    if not os.path.isdir(base):
        return done
    for task_dir in os.scandir(base):
        if not task_dir.is_dir():
            continue
        for trial in os.scandir(task_dir.path):
            if not (trial.is_dir() and trial.name.startswith(prefix)):
                continue
            names = os.listdir(trial.path)
            for name in names:
                if name.endswith(_TMP_SUFFIX):
                    os.remove(os.path.join(trial.path, name))
            if GAME_FILE in names and TRAJ_FILE in names:
                done[int(trial.name[len(prefix):])] = trial.path
    return done


def _recipe(seed: int, solver: str, task_types, rooms) -> dict:
    from importlib.metadata import version

    return {"generator": GENERATOR_VERSION, "alfworld": version("alfworld"), "seed": seed, "solver": solver,
            "task_types": list(task_types) if task_types else None, "rooms": list(rooms) if rooms else None}


def _check_manifest(out: str, recipe: dict) -> dict:
    """The directory's manifest (made now if the directory holds no games); a different recipe is an
    error, so a resumed generation never mixes two sets."""
    path = os.path.join(out, MANIFEST_FILE)
    if os.path.isfile(path):
        with open(path) as f:
            manifest = json.load(f)
        theirs = {k: manifest.get(k) for k in recipe}
        if theirs != recipe:
            diff = {k: (theirs[k], recipe[k]) for k in recipe if theirs[k] != recipe[k]}
            raise ValueError(f"{out} holds games of another recipe ({MANIFEST_FILE}: "
                             + ", ".join(f"{k} {a!r} there, {b!r} asked" for k, (a, b) in diff.items())
                             + "); use another --out or the same options")
        return manifest
    if any(os.listdir(os.path.join(out, DATA_SUBDIR, s)) for s in SPLITS
           if os.path.isdir(os.path.join(out, DATA_SUBDIR, s))):
        raise ValueError(f"{out} holds games but no {MANIFEST_FILE}: not a set this generator can resume; "
                         "use an empty directory")
    return dict(recipe)


def generate_games(out: str, counts: dict[str, int], seed: int = 0, workers: int | None = None,
                   solver: str = "expert", task_types: tuple[str, ...] | None = None,
                   rooms: tuple[str, ...] | None = None, progress=None) -> dict:
    """Write ``counts[split]`` games per split under ``out`` in the official layout, resumably.

    Games already finished under ``out`` (an earlier, interrupted run of the same recipe) are kept
    and not generated again: each game's files are written atomically, the game file last, and
    ``agentrl-generate.json`` at the root records the recipe (a different recipe is refused) and,
    at the end, ``complete``. Work is spread over ``workers`` processes (default: all cores); the
    games do not depend on it. ``progress(done, total)`` is called after every game.

    Returns ``{"trials": [trial dirs, in split and index order], "generated", "skipped", "seconds"}``.
    """
    start = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    recipe = _recipe(seed, solver, task_types, rooms)
    manifest = _check_manifest(out, recipe)
    asked = {s: int(counts.get(s, 0)) for s in SPLITS}
    manifest.update(recipe, complete=False,
                    counts={s: max(asked[s], (manifest.get("counts") or {}).get(s, 0)) for s in SPLITS})
    _write_atomic(os.path.join(out, MANIFEST_FILE), json.dumps(manifest, indent=1))

    trials: dict[tuple[str, int], str] = {}
    jobs = []
    for split in SPLITS:
        done = finished_games(out, seed, split)
        for i in range(asked[split]):
            if i in done:
                trials[(split, i)] = done[i]
            else:
                jobs.append((split, i))
    skipped, total = len(trials), len(trials) + len(jobs)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    args = (solver, task_types, rooms)
    if workers == 1:
        for split, i in jobs:
            trials[(split, i)] = _generate_and_write(out, seed, split, i, *args)
            if progress:
                progress(len(trials), total)
    elif jobs:
        pool = ProcessPoolExecutor(max_workers=workers)
        try:
            futures = {pool.submit(_generate_and_write, out, seed, s, i, *args): (s, i) for s, i in jobs}
            for future in as_completed(futures):
                trials[futures[future]] = future.result()
                if progress:
                    progress(len(trials), total)
        except BaseException:
            # interrupted (Ctrl-C, a failed game): drop the queued games instead of waiting for them;
            # the games finished so far stay and a rerun resumes from them
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    seconds = time.perf_counter() - start
    previous = manifest.get("seconds_total", 0.0)
    manifest.update(complete=all(len(finished_games(out, seed, s)) >= manifest["counts"][s] for s in SPLITS),
                    seconds_total=round(previous + seconds, 1), games=sum(manifest["counts"].values()))
    _write_atomic(os.path.join(out, MANIFEST_FILE), json.dumps(manifest, indent=1))
    ordered = [trials[(s, i)] for s in SPLITS for i in range(asked[s])]
    return {"trials": ordered, "generated": len(jobs), "skipped": skipped, "seconds": seconds}


def generate_dataset(out: str, counts: dict[str, int], seed: int = 0, workers: int | None = None,
                     solver: str = "expert", task_types: tuple[str, ...] | None = None,
                     rooms: tuple[str, ...] | None = None) -> list[str]:
    """:func:`generate_games`' trial directories (resumable, parallel; see there)."""
    return generate_games(out, counts, seed, workers, solver, task_types, rooms)["trials"]
