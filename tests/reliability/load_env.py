"""The environment of the env-server load test, and its server process (test-only).

``test-load``: task ``(tasks, i)`` is won at step ``WIN_STEP`` whatever the action, except what the
action asks for: ``ok`` returns at once, ``slow`` takes ``SLOW_S``, ``hang`` sleeps ``HANG_S``
(past the server's call timeout: the call is abandoned and the instance rebuilt).

``python load_env.py PORT SIZE CALL_TIMEOUT_S`` serves ``SIZE`` instances on ``PORT`` (0: a free one)
and prints the server's ``serving ... at http://127.0.0.1:PORT`` line on stderr, as
``agentrl envs serve`` does; the load test kills it and starts it again on the same port.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from agentrl.envs import register_env
from agentrl.envs.base import TaskRef, TextEnv

WIN_STEP = 6
SLOW_S = 0.2
HANG_S = 5.0


class LoadEnv(TextEnv):
    name = "test-load"

    def __init__(self, max_steps: int = 20):
        super().__init__(max_steps=max_steps)
        self._t = 0

    def split_sizes(self) -> dict[str, int]:
        return {"tasks": 64}

    def _reset_task(self, task: TaskRef) -> tuple[str, dict[str, Any]]:
        self._t = 0
        return f"task {task.index}", {"admissible_actions": ["ok"], "task": f"task {task.index}"}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if action == "slow":
            time.sleep(SLOW_S)
        elif action == "hang":
            time.sleep(HANG_S)
        self._t += 1
        won = self._t >= WIN_STEP
        return f"step {self._t}", float(won), won, {"won": won}

    def expert_actions(self) -> list[str]:
        return ["ok"] * WIN_STEP


register_env("test-load")(LoadEnv)


if __name__ == "__main__":
    from agentrl.envs.server.http_server import serve

    port, size, call_timeout_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    sys.exit(serve("test-load", size, port=port, call_timeout_s=call_timeout_s))
