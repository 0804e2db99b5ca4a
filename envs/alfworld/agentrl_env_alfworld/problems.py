"""One ALFWorld task as a PDDL problem: sampling a task of a type in a scene (its objects and where
they are), the problem file (the structure of ALFWorld's ``augment_pddl_states`` script) and the
goal text. Used by :mod:`agentrl_env_alfworld.generate`.
"""

from __future__ import annotations

import random

from agentrl_env_alfworld.scenes import (ACTION_PROPERTY, HEAT_COOL_CLEAN_APPLIANCE, INSTANCE_WEIGHTS, LAMP_HOSTS,
                                         MAX_INSTANCES, Receptacle, Scene, grid_location, mangle, pddl_coord,
                                         pickupable_types, thor_constants)
# ----- task sampling -----------------------------------------------------------------------------
def _holders(scene: Scene, otype: str) -> list[Receptacle]:
    c = thor_constants()
    if otype in LAMP_HOSTS:
        return [r for r in scene.receptacles if r.rtype in LAMP_HOSTS[otype]]
    return [r for r in scene.receptacles if otype in c.VAL_RECEPTACLE_OBJECTS.get(r.rtype, ())]


def sample_task(task_type: str, scene: Scene, rng: random.Random) -> dict | None:
    """``pddl_params`` of a task of ``task_type`` that the scene can host, or None."""
    c = thor_constants()
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
            placed.append((f"{otype}|{pddl_coord(x)}|{pddl_coord(y)}|{pddl_coord(z)}", otype, host))
    return placed


def _instance_count(rng: random.Random) -> int:
    """Most types appear once, some twice or three times (as in the ALFRED scenes)."""
    return rng.choices(range(1, MAX_INSTANCES + 1), weights=INSTANCE_WEIGHTS)[0]


def _agent_start(scene: Scene, rng: random.Random) -> tuple[int, int, int, int]:
    taken = {r.location for r in scene.receptacles}
    while True:
        x, z = rng.choice(scene.floor_points)
        loc = grid_location(x, z, rng.randrange(4) * 90, 30)
        if loc not in taken:
            return loc


def _loc_id(loc: tuple[int, int, int, int]) -> str:
    return mangle("loc|%d|%d|%d|%d" % loc)


def build_problem(task_id: str, task_type: str, params: dict, scene: Scene, rng: random.Random) -> str:
    """The PDDL problem text, in the structure of ALFWorld's ``initial_state.pddl`` files."""
    import alfworld.gen.goal_library as goal_library

    c = thor_constants()
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
