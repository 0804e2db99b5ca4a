"""Solvable Sokoban rooms from a seed, the way gym-sokoban builds them (reverse play from the solution).

One room from one ``random.Random(seed)``:

1. **Topology**: a random walk of ``int(1.7 * (height + width))`` steps over the interior, each step
   opening a 3x3 stamp (a line, a corner, a 2x2 block...) around the walker, which turns with
   probability 0.35; the border is wall. (gym-sokoban's ``room_topology_generation``.)
2. **Targets and player**: ``num_boxes`` targets and the player on distinct open cells, the boxes
   on their targets (the solved room).
3. **Reverse play**: a breadth-first search from the solved room over moves *that pull*: the
   player steps to a free neighbour and may drag the box behind it. Every state reached this way
   can be solved forward by undoing the pulls. The search goes ``search_depth`` moves deep (at
   most ``MAX_REVERSE_STATES`` states). Among the box placements reached with no box on any
   target, the one with the largest box displacement (sum of the Manhattan distances of every box
   from its own target: gym-sokoban's score) is kept, ties broken by the seed; the player starts
   on one of the cells the reverse play reached with those boxes, chosen by the seed (gym-sokoban
   keeps the cell of the last pull, next to a box; RAGEN moves the player a few random steps away).
4. **Verification**: the forward solver (:func:`agentrl_env_sokoban.solver.solve`) must solve the
   room within ``max_moves`` moves; its solution is the task's expert plan.

A seed whose room fails a step (too few open cells, no box moved, no solution within
``max_moves``) draws a new topology from the same generator, so every seed gives one room.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from agentrl_env_sokoban.room import DIRECTIONS, Pos, Room
from agentrl_env_sokoban.solver import solve

P_CHANGE_DIRECTION = 0.35
MAX_REVERSE_STATES = 100_000
MAX_ATTEMPTS = 200
# the stamps opened around the walker (1 = open), as in gym-sokoban
STAMPS = (
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
    ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
)


@dataclass(frozen=True)
class GeneratedRoom:
    room: Room
    solution: tuple[str, ...]   # a shortest solution (the expert plan)
    displacement: int           # the reverse play's score
    attempts: int               # topologies drawn before this one passed


def topology(rng: random.Random, height: int, width: int) -> frozenset[Pos]:
    """The open cells of a random-walk room."""
    directions = list(DIRECTIONS.values())
    direction = rng.choice(directions)
    r, c = rng.randint(1, height - 2), rng.randint(1, width - 2)
    opened: set[Pos] = set()
    for _ in range(int(1.7 * (height + width))):
        if rng.random() < P_CHANGE_DIRECTION:
            direction = rng.choice(directions)
        r = max(1, min(height - 2, r + direction[0]))
        c = max(1, min(width - 2, c + direction[1]))
        stamp = rng.choice(STAMPS)
        for dr in range(3):
            for dc in range(3):
                if stamp[dr][dc]:
                    opened.add((r + dr - 1, c + dc - 1))
    return frozenset((r, c) for r, c in opened if 0 < r < height - 1 and 0 < c < width - 1)


def reverse_play(room: Room, search_depth: int) -> tuple[tuple[Pos, ...], list[Pos], int] | None:
    """The farthest box placement reverse play reaches from the solved ``room`` (boxes in target
    order), the player cells it was reached with (in search order) and its displacement; None if every placement
    leaves a box on a target."""
    targets = tuple(sorted(room.targets))
    start = (room.player, targets)
    seen = {start}
    frontier = deque([(start, 0)])
    best_score = 0
    best: dict[tuple[Pos, ...], list[Pos]] = {}
    while frontier and len(seen) < MAX_REVERSE_STATES:
        (player, boxes), depth = frontier.popleft()
        if not room.targets.intersection(boxes):
            score = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
            if score > best_score:
                best_score, best = score, {}
            if score == best_score:
                best.setdefault(boxes, []).append(player)
        if depth >= search_depth:
            continue
        for dr, dc in DIRECTIONS.values():
            ahead = (player[0] + dr, player[1] + dc)
            if not room.is_open(ahead) or ahead in boxes:
                continue
            behind = (player[0] - dr, player[1] - dc)
            successors = [(ahead, boxes)]
            if behind in boxes:  # the same step, dragging the box behind onto the player's old cell
                successors.append((ahead, tuple(player if b == behind else b for b in boxes)))
            for state in successors:
                if state not in seen:
                    seen.add(state)
                    frontier.append((state, depth + 1))
    if not best:
        return None
    placements = sorted(best)
    return placements[0], best[placements[0]], best_score


def generate_room(seed: int, height: int = 6, width: int = 6, num_boxes: int = 1, search_depth: int = 30,
                  max_moves: int = 15) -> GeneratedRoom:
    """The room of ``seed`` (same arguments, same room, on every machine)."""
    rng = random.Random(seed)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        cells = sorted(topology(rng, height, width))
        if len(cells) <= num_boxes + 1:
            continue
        player, *targets = rng.sample(cells, num_boxes + 1)
        walls = frozenset((r, c) for r in range(height) for c in range(width)) - frozenset(cells)
        solved = Room(height, width, walls, frozenset(targets), frozenset(targets), player)
        found = reverse_play(solved, search_depth)
        if found is None:
            continue
        boxes, players, score = found
        room = solved.with_state(rng.choice(players), frozenset(boxes))
        solution = solve(room, max_moves=max_moves)
        if solution is None:
            continue
        return GeneratedRoom(room, tuple(solution), score, attempt)
    raise RuntimeError(f"no solvable {height}x{width} room with {num_boxes} boxes within {max_moves} moves "
                       f"after {MAX_ATTEMPTS} attempts (seed {seed}): raise max_moves or the room size")
