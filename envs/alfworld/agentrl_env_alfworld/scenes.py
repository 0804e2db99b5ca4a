"""The iTHOR scenes ALFWorld's games are built from, as the ``alfworld`` package ships them: the
receptacles and objects of each scene (``gen/layouts``), the rules of which object goes where
(``gen/constants.py``), the room kinds and the scenes of each split; the PDDL domain and text
grammar (:func:`game_logic`). Used by :mod:`agentrl_env_alfworld.problems` and
:mod:`agentrl_env_alfworld.generate`; the engine's package is imported only when a scene is read.
"""

from __future__ import annotations

import functools
import json
import os
import random
from dataclasses import dataclass

from agentrl_env_alfworld.tasks import VALID_UNSEEN_SCENES

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


def thor_constants():
    import alfworld.gen.constants as constants

    return constants


def mangle(text: str) -> str:
    """ALFRED's PDDL-safe spelling of THOR ids (``fix_pddl_str_chars``)."""
    table = {"-": "_minus_", "#": "-", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(ch, ch) for ch in text)


def pddl_coord(v: float) -> str:
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


def grid_location(x: float, z: float, rotation: float, horizon: float) -> tuple[int, int, int, int]:
    return (int(round(x / GRID)), int(round(z / GRID)), int(round(rotation / 90)) % 4, int(round(horizon)))


@functools.lru_cache(maxsize=None)
def load_scene(number: int) -> Scene:
    """One iTHOR scene from the layout files the ``alfworld`` package ships."""
    import numpy as np

    c = thor_constants()
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
        receptacles.append(Receptacle(thor_id, rtype, grid_location(x, z, rotation, horizon)))
    positioned = {r.rtype for r in receptacles}
    rng = random.Random(f"scene-{number}")
    for rtype in sorted((object_types & static) - positioned):
        for _ in range(UNPOSITIONED_COUNTS.get(rtype, 1)):
            x, z = rng.choice(floor_points)
            y = rng.uniform(0.0, 1.0)
            thor_id = f"{rtype}|{pddl_coord(x)}|{pddl_coord(y)}|{pddl_coord(z)}"
            if rtype == "SinkBasin":
                thor_id = f"Sink|{pddl_coord(x)}|{pddl_coord(y)}|{pddl_coord(z)}|SinkBasin"
            receptacles.append(Receptacle(thor_id, rtype, grid_location(x, z, rng.randrange(4) * 90, 30)))
    return Scene(number, tuple(receptacles), object_types, floor_points)


def pickupable_types() -> set[str]:
    """Object types that can be placed somewhere (every one of them can be picked up in THOR)."""
    c = thor_constants()
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
        scenes = [n for n in thor_constants().TRAIN_SCENE_NUMBERS if n not in VALID_UNSEEN_SCENES]
    if rooms is not None:
        unknown = set(rooms) - set(ROOM_KINDS)
        if unknown:
            raise ValueError(f"unknown room kinds {sorted(unknown)}; choose from {ROOM_KINDS}")
        scenes = [n for n in scenes if room_kind(n) in rooms]
    return scenes
