"""A small real environment that fails on request, for the env server tests (registered as ``test-flaky``)."""

from __future__ import annotations

import os
import time
from typing import Any

from agentrl.envs import register_env
from agentrl.envs.base import TaskRef, TextEnv


class FlakyEnv(TextEnv):
    """A tiny real environment for server tests. Task ``(tasks, i)`` is won by the action ``win``;
    ``explode`` raises inside ``step``, ``die`` ends the whole process (a crashed native engine),
    ``sleep S`` blocks for S seconds, every reset of the split ``broken`` raises and every reset of
    the split ``slow`` takes 0.4 s (a game being loaded)."""

    name = "test-flaky"

    def split_sizes(self) -> dict[str, int]:
        return {"tasks": 4, "broken": 1, "slow": 2}

    def _reset_task(self, task: TaskRef) -> tuple[str, dict[str, Any]]:
        if task.split == "broken":
            raise RuntimeError("task files are missing")
        if task.split == "slow":
            time.sleep(0.4)
        return f"task {task.index}", {"admissible_actions": ["win", "wait"], "task": f"task {task.index}"}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if action == "explode":
            raise RuntimeError("engine crashed")
        if action == "die":
            os._exit(3)
        if action.startswith("sleep "):
            time.sleep(float(action.split()[1]))
        won = action == "win"
        return f"you did {action}", float(won), won, {"won": won}

    def expert_actions(self) -> list[str]:
        return ["win"]


def make_flaky_env() -> FlakyEnv:
    return FlakyEnv(max_steps=5)


register_env("test-flaky")(make_flaky_env)
