"""An omniscient expert for the six ALFWorld task families, read off the engine's facts.

It plans from the state right after ``reset``: it knows where every object is (unlike ALFWorld's
hand-coded expert, which searches receptacles one by one), so its plans are short, like the
planner's. The plan uses the engine's own command templates (``go to R``, ``open R``, ``take O from
R``, ``clean/heat/cool O with R``, ``move O to R``, ``use L``), and it tracks the agent's location
because ``go to R`` is not admissible for a receptacle at the current location (several
receptacles can share one location). Plans are checked by replaying them in the engine.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

APPLIANCE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "clean"),
    "pick_heat_then_place_in_recep": ("Microwave", "heat"),
    "pick_cool_then_place_in_recep": ("Fridge", "cool"),
}


class WorldFacts:
    """The few relations the expert needs, keyed by display names (``mug 1``)."""

    def __init__(self, facts: Iterable, entity_infos: dict):
        def name(var) -> str:
            info = entity_infos.get(var.name)
            return (info.name if info is not None and info.name else var.name).strip()

        self.object_type: dict[str, str] = {}
        self.receptacle_type: dict[str, str] = {}
        self.inside: dict[str, str] = {}  # object -> receptacle
        self.location_of: dict[str, str] = {}  # receptacle -> location
        self.openable: set[str] = set()
        self.opened: set[str] = set()
        self.agent_location: str | None = None
        for fact in facts:
            args = [name(v) for v in fact.arguments]
            pred = fact.name.lower()
            if pred == "objecttype":
                self.object_type[args[0]] = args[1]
            elif pred == "receptacletype":
                self.receptacle_type[args[0]] = args[1]
            elif pred == "inreceptacle":
                self.inside[args[0]] = args[1]
            elif pred == "receptacleatlocation":
                self.location_of[args[0]] = args[1]
            elif pred == "openable":
                self.openable.add(args[0])
            elif pred == "opened":
                self.opened.add(args[0])
            elif pred == "atlocation":
                self.agent_location = args[1]

    def objects_of(self, otype: str) -> list[str]:
        otype = _type_name(otype)
        return sorted((o for o, t in self.object_type.items() if t == otype and o in self.inside), key=_natural)

    def receptacles_of(self, rtype: str) -> list[str]:
        rtype = _type_name(rtype)
        return sorted((r for r, t in self.receptacle_type.items() if t == rtype), key=_natural)


def _type_name(cls: str) -> str:
    """``Mug`` -> ``mugtype``: the engine lower-cases PDDL names."""
    return f"{cls}type".lower()


def _natural(name: str):
    head, _, num = name.rpartition(" ")
    return (head, int(num)) if num.isdigit() else (name, 0)


class _Planner:
    def __init__(self, world: WorldFacts):
        self.w = world
        self.at = world.agent_location
        self.opened = set(world.opened)
        self.plan: list[str] = []

    def go(self, recep: str) -> None:
        if self.w.location_of.get(recep) != self.at:
            self.plan.append(f"go to {recep}")
            self.at = self.w.location_of.get(recep)

    def open_if_closed(self, recep: str) -> None:
        if recep in self.w.openable and recep not in self.opened:
            self.plan.append(f"open {recep}")
            self.opened.add(recep)

    def take(self, obj: str) -> None:
        source = self.w.inside[obj]
        self.go(source)
        self.open_if_closed(source)
        self.plan.append(f"take {obj} from {source}")

    def put(self, obj: str, recep: str) -> None:
        self.go(recep)
        self.open_if_closed(recep)
        self.plan.append(f"move {obj} to {recep}")


def expert_plan(task_type: str, params: dict, facts: Iterable, entity_infos: dict) -> list[str]:
    """A winning command sequence from the reset state, or ``[]`` if the facts allow none."""
    w = WorldFacts(facts, entity_infos)
    p = _Planner(w)
    obj_type = params["object_target"]
    candidates = w.objects_of(obj_type)
    if task_type == "look_at_obj_in_light":
        lamps = [o for o in w.objects_of(params["toggle_target"])]
        if not candidates or not lamps:
            return []
        p.take(candidates[0])
        p.go(w.inside[lamps[0]])
        p.plan.append(f"use {lamps[0]}")
        return p.plan
    parent_type = _type_name(params["parent_target"])
    destinations = w.receptacles_of(params["parent_target"])
    if not destinations:
        return []
    if task_type == "pick_two_obj_and_place":
        placed = defaultdict(list)
        for o in candidates:
            if w.receptacle_type.get(w.inside[o]) == parent_type:
                placed[w.inside[o]].append(o)
        dest = max(destinations, key=lambda r: len(placed[r]))  # first of the fullest
        movers = [o for o in candidates if w.inside[o] != dest][: max(0, 2 - len(placed[dest]))]
        if len(movers) + len(placed[dest]) < 2:
            return []
        for o in movers:
            p.take(o)
            p.put(o, dest)
        return p.plan
    movers = [o for o in candidates if w.receptacle_type.get(w.inside[o]) != parent_type] or candidates
    if not movers:
        return []
    obj = movers[0]
    p.take(obj)
    if task_type in APPLIANCE:
        appliance_type, verb = APPLIANCE[task_type]
        appliances = w.receptacles_of(appliance_type)
        if not appliances:
            return []
        p.go(appliances[0])
        p.plan.append(f"{verb} {obj} with {appliances[0]}")
    p.put(obj, destinations[0])
    return p.plan
