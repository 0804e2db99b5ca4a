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
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from agentrl_env_alfworld.tasks import (
    DATA_SUBDIR, GAME_FILE, SPLITS, TASK_TYPES, TRAJ_FILE, VALID_UNSEEN_SCENES)

GENERATOR_VERSION = 1
SOLVERS = ("expert", "planner", "search")
GRID = 0.25  # metres per navigation grid step (ALFRED's AGENT_STEP_SIZE)
MAX_INSTANCES = 3  # at most this many instances of one object type (ALFRED's MAX_NUM_OF_OBJ_INSTANCES)
INSTANCE_WEIGHTS = (0.7, 0.2, 0.1)
# solver="search": the searching expert must win within this many steps (ALFWorld's episode limit)
SEARCH_SOLVER_MAX_STEPS = 50
# Lamps are not in VAL_RECEPTACLE_OBJECTS; in the THOR scenes they stand on these furniture types.
LAMP_HOSTS = {
    "DeskLamp": ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable"),
    "FloorLamp": ("SideTable", "Dresser", "Desk", "CoffeeTable", "ArmChair", "Sofa"),
}
# Receptacle types present in a scene's object list but without a position in its layout file get
# this many instances (iTHOR kitchens have four stove burners), otherwise one.
UNPOSITIONED_COUNTS = {"StoveBurner": 4}
HEAT_COOL_CLEAN_APPLIANCE = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
ACTION_PROPERTY = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}


def _pkg_dir() -> str:
    import alfworld.gen  # the engine's package; imported only when generating

    return os.path.dirname(os.path.dirname(alfworld.gen.__file__))


@functools.lru_cache(maxsize=1)
def game_logic() -> dict[str, str]:
    """The installed package's ``alfred.pddl`` domain and ``alfred.twl2`` grammar."""
    data = os.path.join(_pkg_dir(), "data")
    with open(os.path.join(data, "alfred.pddl")) as f:
        domain = f.read()
    with open(os.path.join(data, "alfred.twl2")) as f:
        grammar = f.read()
    return {"pddl_domain": domain, "grammar": grammar}


def _constants():
    import alfworld.gen.constants as constants

    return constants


def mangle(text: str) -> str:
    """ALFRED's PDDL-safe spelling of THOR ids (``fix_pddl_str_chars``)."""
    table = {"-": "_minus_", "#": "-", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(ch, ch) for ch in text)


def _coord(v: float) -> str:
    return f"{v:+06.2f}"


@dataclass(frozen=True)
class Receptacle:
    thor_id: str  # e.g. "Cabinet|+00.68|+00.50|-02.20" or "Sink|-01.90|+00.97|-01.50|SinkBasin"
    rtype: str
    location: tuple[int, int, int, int]


@dataclass(frozen=True)
class Scene:
    number: int
    receptacles: tuple[Receptacle, ...]
    object_types: frozenset[str]
    floor_points: tuple[tuple[float, float], ...]

    def receptacle_types(self) -> set[str]:
        return {r.rtype for r in self.receptacles}


def _location(x: float, z: float, rotation: float, horizon: float) -> tuple[int, int, int, int]:
    return (int(round(x / GRID)), int(round(z / GRID)), int(round(rotation / 90)) % 4, int(round(horizon)))


@functools.lru_cache(maxsize=None)
def load_scene(number: int) -> Scene:
    """One iTHOR scene from the layout files the ``alfworld`` package ships."""
    import numpy as np

    c = _constants()
    layouts = os.path.join(_pkg_dir(), "gen", "layouts")
    with open(os.path.join(layouts, f"FloorPlan{number}-objects.json")) as f:
        object_types = frozenset(json.load(f))
    with open(os.path.join(layouts, f"FloorPlan{number}-openable.json")) as f:
        poses = json.load(f)
    points = np.load(os.path.join(layouts, f"FloorPlan{number}-layout.npy"))
    floor_points = tuple(sorted((float(x), float(z)) for x, z in points.tolist()))
    static = set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)
    receptacles = []
    for thor_id in sorted(poses):
        parts = thor_id.split("|")
        rtype = parts[-1] if len(parts) == 5 else parts[0]
        x, z, rotation, horizon = poses[thor_id]
        receptacles.append(Receptacle(thor_id, rtype, _location(x, z, rotation, horizon)))
    positioned = {r.rtype for r in receptacles}
    rng = random.Random(f"scene-{number}")
    for rtype in sorted((object_types & static) - positioned):
        for _ in range(UNPOSITIONED_COUNTS.get(rtype, 1)):
            x, z = rng.choice(floor_points)
            y = rng.uniform(0.0, 1.0)
            thor_id = f"{rtype}|{_coord(x)}|{_coord(y)}|{_coord(z)}"
            if rtype == "SinkBasin":
                thor_id = f"Sink|{_coord(x)}|{_coord(y)}|{_coord(z)}|SinkBasin"
            receptacles.append(Receptacle(thor_id, rtype, _location(x, z, rng.randrange(4) * 90, 30)))
    return Scene(number, tuple(receptacles), object_types, floor_points)


def pickupable_types() -> set[str]:
    """Object types that can be placed somewhere (every one of them can be picked up in THOR)."""
    c = _constants()
    placeable = set().union(*c.VAL_RECEPTACLE_OBJECTS.values())
    return {t for t in placeable if not t.endswith("Sliced")}


# iTHOR numbers its scenes by room kind: FloorPlan1-30 kitchens, 201-230 living rooms,
# 301-330 bedrooms, 401-430 bathrooms.
ROOM_KINDS = ("kitchen", "livingroom", "bedroom", "bathroom")


def room_kind(scene_number: int) -> str:
    """``kitchen``, ``livingroom``, ``bedroom`` or ``bathroom`` for an iTHOR scene number."""
    kind = {0: "kitchen", 2: "livingroom", 3: "bedroom", 4: "bathroom"}.get(scene_number // 100)
    if kind is None:
        raise ValueError(f"no iTHOR room kind for scene {scene_number}")
    return kind


def scene_numbers(split: str, rooms: tuple[str, ...] | None = None) -> list[int]:
    """Scenes of each split: the unseen scenes are held out of train and valid_seen.

    ``rooms`` keeps only scenes of those room kinds (:data:`ROOM_KINDS`).
    """
    if split == "valid_unseen":
        scenes = list(VALID_UNSEEN_SCENES)
    else:
        scenes = [n for n in _constants().TRAIN_SCENE_NUMBERS if n not in VALID_UNSEEN_SCENES]
    if rooms is not None:
        unknown = set(rooms) - set(ROOM_KINDS)
        if unknown:
            raise ValueError(f"unknown room kinds {sorted(unknown)}; choose from {ROOM_KINDS}")
        scenes = [n for n in scenes if room_kind(n) in rooms]
    return scenes


# ----- task sampling -----------------------------------------------------------------------------
def _holders(scene: Scene, otype: str) -> list[Receptacle]:
    c = _constants()
    if otype in LAMP_HOSTS:
        return [r for r in scene.receptacles if r.rtype in LAMP_HOSTS[otype]]
    return [r for r in scene.receptacles if otype in c.VAL_RECEPTACLE_OBJECTS.get(r.rtype, ())]


def sample_task(task_type: str, scene: Scene, rng: random.Random) -> dict | None:
    """``pddl_params`` of a task of ``task_type`` that the scene can host, or None."""
    c = _constants()
    present = sorted(t for t in scene.object_types & pickupable_types() if _holders(scene, t))
    rtypes = sorted(scene.receptacle_types())
    params = {"object_target": None, "parent_target": None, "toggle_target": None,
              "mrecep_target": None, "object_sliced": False}
    if task_type == "look_at_obj_in_light":
        lamps = sorted(t for t in ("DeskLamp", "FloorLamp") if t in scene.object_types and _holders(scene, t))
        if not lamps or not present:
            return None
        params.update(object_target=rng.choice(present), toggle_target=rng.choice(lamps))
        return params
    if task_type in ACTION_PROPERTY:
        appliance = HEAT_COOL_CLEAN_APPLIANCE[task_type]
        if appliance not in rtypes:
            return None
        present = [t for t in present if t in c.VAL_ACTION_OBJECTS[ACTION_PROPERTY[task_type]]]
    pairs = []
    for otype in present:
        for rtype in rtypes:
            if rtype == HEAT_COOL_CLEAN_APPLIANCE.get(task_type):
                continue
            if otype in c.VAL_RECEPTACLE_OBJECTS.get(rtype, ()):
                # the object must be able to start somewhere that is not the goal receptacle type
                if any(h.rtype != rtype for h in _holders(scene, otype)):
                    pairs.append((otype, rtype))
    if not pairs:
        return None
    otype, rtype = rng.choice(pairs)
    params.update(object_target=otype, parent_target=rtype)
    return params


def _place_objects(scene: Scene, params: dict, task_type: str, rng: random.Random):
    """Object instances and their receptacles, with the goal not satisfied at the start."""
    target, parent = params["object_target"], params["parent_target"]
    placed: list[tuple[str, str, Receptacle]] = []  # (thor id, type, receptacle)
    types = sorted(scene.object_types & pickupable_types())
    if params["toggle_target"]:
        types.append(params["toggle_target"])
    for otype in types:
        holders = _holders(scene, otype)
        if otype == target and parent:
            holders = [h for h in holders if h.rtype != parent]
        if not holders:
            continue
        low = 2 if (otype == target and task_type == "pick_two_obj_and_place") else 1
        count = 1 if otype == params["toggle_target"] else max(low, _instance_count(rng))
        for _ in range(count):
            host = rng.choice(holders)
            hx, hy, hz = (float(v) for v in host.thor_id.split("|")[1:4])
            x, y, z = hx + rng.uniform(-0.4, 0.4), hy + rng.uniform(0.0, 0.3), hz + rng.uniform(-0.4, 0.4)
            placed.append((f"{otype}|{_coord(x)}|{_coord(y)}|{_coord(z)}", otype, host))
    return placed


def _instance_count(rng: random.Random) -> int:
    """Most types appear once, some twice or three times (as in the ALFRED scenes)."""
    return rng.choices(range(1, MAX_INSTANCES + 1), weights=INSTANCE_WEIGHTS)[0]


def _agent_start(scene: Scene, rng: random.Random) -> tuple[int, int, int, int]:
    taken = {r.location for r in scene.receptacles}
    while True:
        x, z = rng.choice(scene.floor_points)
        loc = _location(x, z, rng.randrange(4) * 90, 30)
        if loc not in taken:
            return loc


def _loc_id(loc: tuple[int, int, int, int]) -> str:
    return mangle("loc|%d|%d|%d|%d" % loc)


def build_problem(task_id: str, task_type: str, params: dict, scene: Scene, rng: random.Random) -> str:
    """The PDDL problem text, in the structure of ALFWorld's ``initial_state.pddl`` files."""
    import alfworld.gen.goal_library as goal_library

    c = _constants()
    placed = _place_objects(scene, params, task_type, rng)
    start = _agent_start(scene, rng)
    receptacle_types = sorted(set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES))
    type_objects = sorted(set(c.OBJECTS_SET) - set(receptacle_types))
    recs = sorted(scene.receptacles, key=lambda r: r.thor_id)
    objs = sorted(placed, key=lambda p: p[0])
    locations = sorted({r.location for r in recs}) + [start]

    lines = [f"(define (problem plan_{mangle(task_id)})", "(:domain alfred)", "(:objects", "agent1 - agent"]
    lines += [f"{t} - object" for t in type_objects]
    lines += [f"{t}Type - otype" for t in type_objects]
    lines += [f"{t}Type - rtype" for t in receptacle_types]
    lines += [f"        {mangle(o)} - object" for o, _, _ in objs]
    lines += [f"        {mangle(r.thor_id)} - receptacle" for r in recs]
    lines += [f"        {_loc_id(loc)} - location" for loc in locations]
    lines += ["        )", "", "(:init", ""]
    init: list[str] = []
    init += [f"(receptacleType {mangle(r.thor_id)} {r.rtype}Type)" for r in recs]
    init += [f"(objectType {mangle(o)} {t}Type)" for o, t, _ in objs]
    scene_types = {t for _, t, _ in objs}
    can_contain = sorted({(r.rtype, t) for r in recs for t in c.VAL_RECEPTACLE_OBJECTS.get(r.rtype, ())
                          if t in scene_types})
    init += [f"(canContain {rt}Type {ot}Type)" for rt, ot in can_contain]
    init += [f"(pickupable {mangle(o)})" for o, t, _ in objs if t not in LAMP_HOSTS]
    init += [f"(isReceptacleObject {mangle(o)})" for o, t, _ in objs if t in c.MOVABLE_RECEPTACLES_SET]
    init += [f"(openable {mangle(r.thor_id)})" for r in recs if r.rtype in c.OPENABLE_CLASS_SET]
    init += [f"(atLocation agent1 {_loc_id(start)})"]
    for prop, pred in (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable"),
                       ("Toggleable", "toggleable"), ("Sliceable", "sliceable")):
        init += [f"({pred} {mangle(o)})" for o, t, _ in objs if t in c.VAL_ACTION_OBJECTS[prop]]
    init += [f"(inReceptacle {mangle(o)} {mangle(r.thor_id)})" for o, _, r in objs]
    init += [f"(receptacleAtLocation {mangle(r.thor_id)} {_loc_id(r.location)})" for r in recs]
    init += [f"(objectAtLocation {mangle(o)} {_loc_id(r.location)})" for o, _, r in objs]
    lines += [f"        {fact}" for fact in init]
    lines += ["        )", ""]
    goal = goal_library.gdict[task_type]["pddl"].format(
        obj=params["object_target"], recep=params["parent_target"],
        toggle=params["toggle_target"], mrecep=params["mrecep_target"])
    lines.append(mangle(goal))
    return "\n".join(lines) + "\n"


def goal_text(task_type: str, params: dict, rng: random.Random) -> str:
    """One of the task type's goal templates, filled in (as ALFWorld's ``get_templated_task_desc``)."""
    import alfworld.gen.goal_library as goal_library

    template = rng.choice(goal_library.gdict[task_type]["templates"])
    fill = {k: (params[f"{k}_target"] or "").lower() for k in ("object", "parent", "toggle", "mrecep")}
    return template.format(obj=fill["object"], recep=fill["parent"], toggle=fill["toggle"],
                           mrecep=fill["mrecep"])


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
