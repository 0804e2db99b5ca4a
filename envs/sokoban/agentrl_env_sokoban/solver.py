"""The expert: a breadth-first search over (player, boxes) states for a shortest solution in moves.

Every move costs one step (the environment's step limit counts moves), so breadth-first search
returns a solution with the fewest moves. Two prunings keep it small without losing solutions:

* a box pushed onto a *dead square* (a non-target cell from which no box can ever reach a target,
  found once per room by pulling a box backwards from every target) is never explored further;
* states are deduplicated on the player's cell and the set of box cells.

``max_states`` bounds the search; :func:`solve` returns None when the room has no solution (or
none was found within the bound: the generator counts that as unsolvable and never emits it).
"""

from __future__ import annotations

from collections import deque

from agentrl_env_sokoban.room import ACTIONS, DIRECTIONS, Pos, Room

DEFAULT_MAX_STATES = 200_000


def dead_squares(room: Room) -> frozenset[Pos]:
    """Open cells from which a lone box can never be pushed onto any target."""
    live: set[Pos] = set(room.targets)
    frontier = deque(room.targets)
    while frontier:
        box = frontier.popleft()
        for dr, dc in DIRECTIONS.values():
            # pulling the box from ``box`` to ``prev``: the player stands at prev and steps further back
            prev, player = (box[0] - dr, box[1] - dc), (box[0] - 2 * dr, box[1] - 2 * dc)
            if prev not in live and room.is_open(prev) and room.is_open(player):
                live.add(prev)
                frontier.append(prev)
    return frozenset((r, c) for r in range(room.height) for c in range(room.width)
                     if room.is_open((r, c)) and (r, c) not in live)


def solve(room: Room, max_moves: int | None = None, max_states: int = DEFAULT_MAX_STATES) -> list[str] | None:
    """A shortest move sequence that puts every box on a target, or None (none within the bounds)."""
    if room.solved:
        return []
    dead = dead_squares(room)
    if room.boxes & dead:
        return None
    start = room.state_key()
    parents: dict[tuple, tuple | None] = {start: None}
    frontier = deque([(start, 0)])
    while frontier:
        (player, boxes), depth = frontier.popleft()
        if max_moves is not None and depth >= max_moves:
            continue
        here = room.with_state(player, boxes)
        for action in ACTIONS:
            after, moved, pushed = here.move(action)
            if not moved or (pushed is not None and pushed in dead):
                continue
            key = after.state_key()
            if key in parents:
                continue
            parents[key] = ((player, boxes), action)
            if pushed is not None and after.solved:
                return _path(parents, key)
            if len(parents) > max_states:
                return None
            frontier.append((key, depth + 1))
    return None


def _path(parents: dict, key) -> list[str]:
    actions = []
    while parents[key] is not None:
        key, action = parents[key]
        actions.append(action)
    return actions[::-1]


def replay(room: Room, actions: list[str]) -> Room:
    """The room after the moves (how the tests check that a solution solves)."""
    for action in actions:
        room = room.move(action).room
    return room
