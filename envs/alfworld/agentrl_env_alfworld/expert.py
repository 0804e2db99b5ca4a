"""Two experts for the six ALFWorld task families: an omniscient planner and a searching policy.

:func:`expert_plan` (the generator's default solver and the stored walkthroughs) reads the hidden
object locations off the engine's facts. :func:`search_action` knows only what the agent sees and
searches receptacles in the listed order, so a model can imitate it on unseen layouts; see the
section "the searching expert" below.

The omniscient expert plans from the state right after ``reset``: it knows where every object is
(unlike ALFWorld's hand-coded expert, which searches receptacles one by one), so its plans are
short, like the planner's. The plan uses the engine's own command templates (``go to R``, ``open
R``, ``take O from R``, ``clean/heat/cool O with R``, ``move O to R``, ``use L``), and it tracks
the agent's location because ``go to R`` is not admissible for a receptacle at the current location
(several receptacles can share one location). Plans are checked by replaying them in the engine.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Collection, Iterable

from agentrl_env_alfworld.tasks import TASK_PREFIX, task_line

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


# ----- the searching expert ------------------------------------------------------------------------
# A policy, not a plan: it sees only what an agent sees (the goal, the receptacles listed in the
# first observation, the latest observation and the admissible commands) and never the hidden
# object locations. It searches the receptacles in the order the first observation lists them.
SEARCH_GOALS = (  # (family, pattern over the goal text); the first full match wins
    ("look_at_obj_in_light", r"look at (?P<obj>\w+) under the (?P<lamp>\w+)"),
    ("look_at_obj_in_light", r"examine the (?P<obj>\w+) with the (?P<lamp>\w+)"),
    ("pick_clean_then_place_in_recep", r"put a clean (?P<obj>\w+) in (?P<dest>\w+)"),
    ("pick_clean_then_place_in_recep", r"clean some (?P<obj>\w+) and put it in (?P<dest>\w+)"),
    ("pick_heat_then_place_in_recep", r"put a hot (?P<obj>\w+) in (?P<dest>\w+)"),
    ("pick_heat_then_place_in_recep", r"heat some (?P<obj>\w+) and put it in (?P<dest>\w+)"),
    ("pick_cool_then_place_in_recep", r"put a cool (?P<obj>\w+) in (?P<dest>\w+)"),
    ("pick_cool_then_place_in_recep", r"cool some (?P<obj>\w+) and put it in (?P<dest>\w+)"),
    ("pick_two_obj_and_place", r"put two (?P<obj>\w+) in (?P<dest>\w+)"),
    ("pick_two_obj_and_place", r"find two (?P<obj>\w+) and put them in (?P<dest>\w+)"),
    ("pick_and_place_simple", r"put a (?P<obj>\w+) in (?P<dest>\w+)"),
    ("pick_and_place_simple", r"put some (?P<obj>\w+) on (?P<dest>\w+)"),
)
# the appliance type (as the engine names receptacles) and the verb of the three "modify" families
SEARCH_APPLIANCE = {family: (appliance.lower(), verb) for family, (appliance, verb) in APPLIANCE.items()}
_NAME = r"[a-z]+ \d+"
# the receptacle an observation is about: where the agent now is (or what it just examined)
_WHERE = tuple(re.compile(p) for p in (
    rf"You arrive at ({_NAME})\.",
    rf"You open the ({_NAME})\.",
    rf"You pick up the {_NAME} from the ({_NAME})\.",
    rf"You move the {_NAME} to the ({_NAME})\.",
    rf"You (?:clean|heat|cool) the {_NAME} using the ({_NAME})\.",
    rf"The ({_NAME}) is (?:closed|open)\.",
    rf"On the ({_NAME}), you see",
))
_ROOM = re.compile(r"Looking quickly around you, you see (.+?)\.(?:\n|$)")
_ITEM = re.compile(rf"\ba ({_NAME})")


@dataclass(frozen=True)
class SearchGoal:
    family: str
    obj: str                  # object type as the engine prints it ("spraybottle")
    dest: str | None = None   # receptacle type to put it in ("toilet"); None for look_at_obj_in_light
    lamp: str | None = None   # lamp type for look_at_obj_in_light ("desklamp")


def parse_goal(task: str) -> SearchGoal:
    """The goal of a task line (``Your task is to: put some mug on desk.``, prefix optional)."""
    text = task.strip()
    text = text[len(TASK_PREFIX):] if text.startswith(TASK_PREFIX) else text
    text = text.rstrip(".").strip().lower()
    for family, pattern in SEARCH_GOALS:
        m = re.fullmatch(pattern, text)
        if m:
            g = m.groupdict()
            return SearchGoal(family, g["obj"], g.get("dest"), g.get("lamp"))
    raise ValueError(f"unrecognised ALFWorld goal: {task!r}")


def listed_receptacles(first_observation: str) -> list[str]:
    """The receptacles of ``Looking quickly around you, you see a cabinet 1, ..., and a toilet 1.``,
    in the order listed."""
    m = _ROOM.search(first_observation)
    if not m:
        raise ValueError("the observation lists no receptacles")
    return _ITEM.findall(m.group(1))


def observed_receptacle(observation: str) -> str | None:
    """The receptacle the latest observation is about (the agent's place), or None (start, look...)."""
    for pattern in _WHERE:
        m = pattern.match(observation.strip())
        if m:
            return m.group(1)
    return None


def _kind(name: str) -> str:
    return name.rsplit(" ", 1)[0]


def held_object(admissible: Iterable[str], receptacles: Iterable[str]) -> str | None:
    """What the agent carries, read off the admissible commands: the engine offers ``examine X``
    for the carried object and for receptacles only."""
    recs = set(receptacles)
    for command in admissible:
        if command.startswith("examine ") and command[len("examine "):] not in recs:
            return command[len("examine "):]
    return None


def search_action(goal: SearchGoal, receptacles: list[str], observation: str, admissible: list[str], *,
                  here: str | None = None, visited: Collection[str] | None = None) -> str:
    """The searching expert's next command: a function of the goal, the receptacle list, the latest
    observation and the admissible commands only: no history is needed, so a model can imitate it
    from its prompt alone when the prompt shows the receptacle list (the env's ``room_in_task``).

    * Not carrying: if the target type is visible in the latest observation (outside the goal's
      destination) take the first one listed; else open the current receptacle if it is closed;
      else visit the receptacle after the current one in the listed order (cyclically; the first
      one at the start).
    * Carrying, look_at_obj_in_light: use the lamp when ``use`` is admissible, else keep visiting
      receptacles in order (without opening: lamps stand on furniture).
    * Carrying, clean/heat/cool: the latest observation is not yet ``You heat the ...``: heat (clean,
      cool) it when that is admissible, else visit the first appliance of the type in the list.
    * Carrying otherwise: visit the first receptacle of the destination type in the list, open it
      if it is closed, move the object into it.
    * Carrying an object that is not the goal's type (never on its own episodes; a policy's state
      it is asked to label): put it down where the agent is (``move X to R``), opening R first if
      it is closed, or walk on to the next receptacle when there is none here to put it in.

    "Visit R" is ``go to R``; when R shares the agent's location, ``go to R`` is not admissible and
    the expert opens R (if closed) or examines it instead.

    Labelling a policy's states (DAgger), where the latest observation may be ``Nothing happens.``:
    ``here`` gives the agent's place when the observation does not name it, and ``visited`` the
    receptacles it has been at; the next receptacle is then the first listed one not visited (on
    the expert's own episodes that is the one after ``here``; the env's ``unvisited_in_task``
    notes show the same list).
    """
    allowed = set(admissible)
    here = observed_receptacle(observation) or here
    held = held_object(admissible, receptacles)

    def visit(recep: str) -> str:
        for command in (f"go to {recep}", f"open {recep}", f"examine {recep}"):
            if command in allowed:
                return command
        raise RuntimeError(f"cannot reach {recep}: {sorted(allowed)}")

    def visit_next(open_closed: bool) -> str:
        if open_closed and here is not None and f"The {here} is closed." in observation \
                and f"open {here}" in allowed:
            return f"open {here}"
        if visited is not None:
            for recep in receptacles:
                if recep != here and recep not in visited:
                    return visit(recep)
        start = receptacles.index(here) + 1 if here in receptacles else 0
        for k in range(len(receptacles)):
            recep = receptacles[(start + k) % len(receptacles)]
            if recep != here:
                return visit(recep)
        raise RuntimeError("no receptacle to visit")

    dest = next((r for r in receptacles if goal.dest and _kind(r) == goal.dest), None)
    if held is not None and _kind(held) != goal.obj:
        if here is not None and f"move {held} to {here}" in allowed:
            return f"move {held} to {here}"
        return visit_next(open_closed=True)
    if held is None:
        if here is not None and here != dest:
            for item in _ITEM.findall(observation.split("you see", 1)[1] if "you see" in observation else ""):
                if _kind(item) == goal.obj and f"take {item} from {here}" in allowed:
                    return f"take {item} from {here}"
        return visit_next(open_closed=True)
    if goal.family == "look_at_obj_in_light":
        for command in admissible:
            if command.startswith("use ") and _kind(command[len("use "):]) == goal.lamp:
                return command
        return visit_next(open_closed=False)
    if dest is None:
        raise RuntimeError(f"no {goal.dest} among the receptacles")
    if here != dest and goal.family in SEARCH_APPLIANCE:
        appliance_kind, verb = SEARCH_APPLIANCE[goal.family]
        if not re.match(rf"You {verb} the ", observation):
            for command in admissible:
                tool = command.rsplit(" with ", 1)[-1]
                if command.startswith(f"{verb} {held} with ") and _kind(tool) == appliance_kind:
                    return command
            appliance = next((r for r in receptacles if _kind(r) == appliance_kind), None)
            if appliance is None:
                raise RuntimeError(f"no {appliance_kind} among the receptacles")
            return visit(appliance)
    if here == dest:
        if f"move {held} to {dest}" in allowed:
            return f"move {held} to {dest}"
        if f"open {dest}" in allowed:
            return f"open {dest}"
    return visit(dest)


class SearchExpert:
    """The searching expert for one episode: ``act(observation, admissible)`` after each step."""

    def __init__(self, first_observation: str, task: str | None = None):
        self.receptacles = listed_receptacles(first_observation)
        self.goal = parse_goal(task if task is not None else task_line(first_observation))

    def act(self, observation: str, admissible: list[str]) -> str:
        return search_action(self.goal, self.receptacles, observation, admissible)


def play_search_expert(engine_env, max_steps: int = 50) -> tuple[list[str], bool]:
    """Play the searching expert from reset in an engine env (:func:`load_engine_env`).

    Returns the commands it issued and whether it won within ``max_steps``.
    """
    state = engine_env.reset()
    first = state.feedback
    expert = SearchExpert(first, task_line(first))
    observation, actions = first, []
    while len(actions) < max_steps:
        action = expert.act(observation, list(state["admissible_commands"]))
        actions.append(action)
        state, _score, done = engine_env.step(action)
        observation = state.feedback
        if state["won"]:
            return actions, True
        if done:
            break
    return actions, False
