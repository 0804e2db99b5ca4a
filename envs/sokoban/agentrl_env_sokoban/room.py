"""A Sokoban room: the fixed layout (walls, targets), the boxes and the player, and the rules of a move.

A room is immutable; :meth:`Room.move` returns the room after one move. Positions are
``(row, column)`` with row 0 at the top. The text form is the grid of RAGEN's text Sokoban (the
symbols of gym-sokoban's room codes):

``#`` wall   ``_`` floor   ``O`` target   ``X`` box   ``√`` box on a target   ``P`` player
``S`` player on a target

Rules (gym-sokoban's): the player moves one cell up, down, left or right onto floor or a target;
moving into a box pushes it one cell further when that cell is floor or a target (not a wall,
not another box); otherwise nothing moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"
LEGEND = (f"{WALL} wall, {FLOOR} floor, {TARGET} target, {BOX} box, {BOX_ON_TARGET} box on a target, "
          f"{PLAYER} you (the player), {PLAYER_ON_TARGET} you on a target")

Pos = tuple[int, int]
# the four moves in the order the solver and the admissible list use
DIRECTIONS: dict[str, Pos] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
ACTIONS = tuple(DIRECTIONS)


class MoveResult(NamedTuple):
    room: "Room"
    moved: bool           # the player changed cell
    pushed: Pos | None    # where the pushed box went, None when no box moved


@dataclass(frozen=True)
class Room:
    height: int
    width: int
    walls: frozenset[Pos]
    targets: frozenset[Pos]
    boxes: frozenset[Pos]
    player: Pos

    # ----- state -------------------------------------------------------------------------------
    @property
    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)

    @property
    def solved(self) -> bool:
        return self.boxes <= self.targets

    def state_key(self) -> tuple[Pos, frozenset[Pos]]:
        """What changes during play: the solver's search state."""
        return self.player, self.boxes

    def with_state(self, player: Pos, boxes: frozenset[Pos]) -> "Room":
        return Room(self.height, self.width, self.walls, self.targets, boxes, player)

    def is_open(self, pos: Pos) -> bool:
        """Inside the grid and not a wall (a box may stand there)."""
        r, c = pos
        return 0 <= r < self.height and 0 <= c < self.width and pos not in self.walls

    # ----- rules -------------------------------------------------------------------------------
    def move(self, action: str) -> MoveResult:
        dr, dc = DIRECTIONS[action]
        r, c = self.player
        ahead = (r + dr, c + dc)
        if not self.is_open(ahead):
            return MoveResult(self, False, None)
        if ahead in self.boxes:
            beyond = (ahead[0] + dr, ahead[1] + dc)
            if not self.is_open(beyond) or beyond in self.boxes:
                return MoveResult(self, False, None)
            boxes = (self.boxes - {ahead}) | {beyond}
            return MoveResult(self.with_state(ahead, boxes), True, beyond)
        return MoveResult(self.with_state(ahead, self.boxes), True, None)

    # ----- text --------------------------------------------------------------------------------
    def cell(self, pos: Pos) -> str:
        if pos in self.walls:
            return WALL
        target = pos in self.targets
        if pos == self.player:
            return PLAYER_ON_TARGET if target else PLAYER
        if pos in self.boxes:
            return BOX_ON_TARGET if target else BOX
        return TARGET if target else FLOOR

    def render(self) -> str:
        return "\n".join("".join(self.cell((r, c)) for c in range(self.width)) for r in range(self.height))

    @classmethod
    def parse(cls, text: str) -> "Room":
        """The room of a grid written with the symbols above (rows of equal length, one player)."""
        rows = [line for line in text.strip("\n").split("\n")]
        width = len(rows[0]) if rows else 0
        if not rows or any(len(row) != width for row in rows):
            raise ValueError("a Sokoban grid needs at least one row and rows of equal length")
        walls, targets, boxes, players = set(), set(), set(), []
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                pos = (r, c)
                if ch == WALL:
                    walls.add(pos)
                elif ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
                    targets.add(pos)
                elif ch not in (FLOOR, BOX, PLAYER):
                    raise ValueError(f"unknown Sokoban symbol {ch!r} at row {r}, column {c} (symbols: {LEGEND})")
                if ch in (BOX, BOX_ON_TARGET):
                    boxes.add(pos)
                if ch in (PLAYER, PLAYER_ON_TARGET):
                    players.append(pos)
        if len(players) != 1:
            raise ValueError(f"a Sokoban grid needs exactly one player, found {len(players)}")
        if len(boxes) != len(targets) or not boxes:
            raise ValueError(f"a Sokoban grid needs as many targets as boxes (and at least one): "
                             f"{len(boxes)} boxes, {len(targets)} targets")
        return cls(len(rows), width, frozenset(walls), frozenset(targets), frozenset(boxes), players[0])
