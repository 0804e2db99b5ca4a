"""Sokoban as a text environment: push every box onto a target, one move per step.

Observation: the room as a grid of symbols (:mod:`agentrl_env_sokoban.room`), after every step.
Actions: ``up``, ``down``, ``left``, ``right`` (case and surrounding spaces ignored), all four
admissible in every state. Anything else changes nothing (gym-sokoban's no-op action).

Rewards (gym-sokoban's, which RAGEN and verl-agent use): -0.1 per step, +1 for each box pushed
onto a target, -1 for each box pushed off one, +10 when every box is on a target; the episode
then terminates. ``info["noop"]`` is True when the player did not move (a wall, a box that cannot
be pushed, or an unknown action).

``info``: ``task_type`` is the room setting (``6x6_1box``), ``depth`` the length of the room's
shortest solution, ``boxes_on_target`` and ``num_boxes`` the progress.
"""

from __future__ import annotations

from typing import Any

from agentrl.envs.base import TaskRef, TextEnv
from agentrl_env_sokoban.generate import GeneratedRoom
from agentrl_env_sokoban.room import ACTIONS, LEGEND, Room
from agentrl_env_sokoban.solver import solve
from agentrl_env_sokoban.tasks import DEFAULT_SETTING, SPLIT_SIZES, setting, task_room

STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
SOLVED_REWARD = 10.0
TASK_TEXT = ("Push every box onto a target. You move one cell up, down, left or right; walking into a box "
             "pushes it one cell if the cell behind it is free. Boxes cannot be pulled. Symbols: " + LEGEND + ".")


class SokobanEnv(TextEnv):
    """One room per task; the room setting is fixed per instance."""

    name = "sokoban"

    def __init__(self, max_steps: int | None = None, room: str = DEFAULT_SETTING):
        self.setting_name = room
        self.setting = setting(room)
        super().__init__(max_steps=max_steps or self.setting.max_moves)
        self.generated: GeneratedRoom | None = None
        self.room: Room | None = None

    def split_sizes(self) -> dict[str, int]:
        return dict(SPLIT_SIZES)

    def _reset_task(self, task: TaskRef) -> tuple[str, dict[str, Any]]:
        self.generated = task_room(self.setting_name, task.split, task.index)
        self.room = self.generated.room
        return self.room.render(), self._info()

    def _info(self) -> dict[str, Any]:
        return {"admissible_actions": list(ACTIONS), "won": self.room.solved, "task": TASK_TEXT,
                "task_type": self.setting_name, "depth": len(self.generated.solution),
                "boxes_on_target": self.room.boxes_on_target, "num_boxes": len(self.room.boxes)}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        command = action.strip().lower()
        reward = STEP_PENALTY
        moved = False
        if command in ACTIONS:
            before = self.room.boxes_on_target
            self.room, moved, _ = self.room.move(command)
            change = self.room.boxes_on_target - before
            reward += BOX_ON_TARGET_REWARD * max(change, 0) + BOX_OFF_TARGET_PENALTY * max(-change, 0)
        solved = self.room.solved
        if solved:
            reward += SOLVED_REWARD
        info = self._info()
        info["noop"] = not moved
        return self.room.render(), reward, solved, info

    # ----- expert ------------------------------------------------------------------------------
    def expert_actions(self) -> list[str]:
        """The room's shortest solution (found and checked when the room was generated)."""
        if self.generated is None:
            raise RuntimeError("sokoban: expert_actions() called before reset()")
        return list(self.generated.solution)

    def expert_next_action(self) -> str:
        """The first move of a shortest solution from the current state (DAgger labels); a
        RuntimeError when no box placement from here can be solved (a box stuck in a corner)."""
        if self.room is None:
            raise RuntimeError("sokoban: expert_next_action() called before reset()")
        plan = solve(self.room)
        if not plan:
            raise RuntimeError("sokoban: the room cannot be solved from this state" if plan is None
                               else "sokoban: the room is already solved")
        return plan[0]
