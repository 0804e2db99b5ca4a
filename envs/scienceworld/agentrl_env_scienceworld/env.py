"""ScienceWorld on its own engine (``scienceworld`` 1.2.3): elementary-school science tasks in a text world.

One engine (a JVM) per environment instance, started reproducible (the same variation, the same
world: :mod:`agentrl_env_scienceworld.engine`). ``reset(task)`` loads the task type and variation of
the address (:mod:`agentrl_env_scienceworld.tasks`) and resets the engine; every observation,
score and valid-action list is the engine's, unchanged:

* the observation is the engine's reply (after reset: its ``look around``);
* the reward is the engine's: the change of the task score (points, 0-100) since the last step;
  ``info["task_score"]`` is the score itself;
* ``terminated`` is the engine's ``isCompleted`` (the task done, or failed: a negative score);
  the episode is won when the score reaches 100;
* ``info["admissible_actions"]`` is the engine's valid action-object combinations;
* ``info["task"]`` is the task description (without its ``Task Description:`` header),
  ``task_type`` the task type (``boil``),
  ``noop`` True when the engine did not understand the command.

The expert is the engine's gold action sequence for the variation. The engine makes it only when a
task is loaded with ``generateGoldPath`` (which costs a few seconds), so :meth:`expert_actions`
reloads the task with it right after reset (the same initial state: with the reproducible JVM a
variation always builds the same world).
"""

from __future__ import annotations

from typing import Any

from agentrl.envs.base import TaskRef, TextEnv
from agentrl_env_scienceworld.engine import start_engine
from agentrl_env_scienceworld.tasks import splits

NOT_UNDERSTOOD = "No known action matches that input."
TASK_HEADER = "Task Description:"
WIN_SCORE = 100


def task_line(description: str) -> str:
    """The engine's task description without its ``Task Description:`` header line."""
    text = description.strip()
    return text[len(TASK_HEADER):].strip() if text.startswith(TASK_HEADER) else text


class ScienceWorldTextEnv(TextEnv):
    """agentrl's text protocol over one ScienceWorld engine."""

    name = "scienceworld"

    def __init__(self, max_steps: int = 100, simplifications: str = "", deterministic: bool = True):
        super().__init__(max_steps=max_steps)
        self.simplifications = simplifications
        self.splits = splits()
        self.engine = start_engine(deterministic)
        self.task_type: str | None = None
        self.variation: int | None = None
        self.gold_loaded = False
        self.score = 0

    def split_sizes(self) -> dict[str, int]:
        return {name: len(tasks) for name, tasks in self.splits.items()}

    def address(self, task: TaskRef) -> tuple[str, int]:
        """The (task type, variation) of a task address."""
        return self.splits[task.split][task.index]

    def _load(self, gold: bool) -> tuple[str, dict[str, Any]]:
        self.engine.load(self.task_type, self.variation, self.simplifications, generateGoldPath=gold)
        self.gold_loaded = gold
        obs, engine_info = self.engine.reset()
        return obs, engine_info

    def _reset_task(self, task: TaskRef) -> tuple[str, dict[str, Any]]:
        self.task_type, self.variation = self.address(task)
        obs, engine_info = self._load(gold=False)
        self.score = int(engine_info["score"])
        return obs, self._info(engine_info, obs, completed=False)

    def _info(self, engine_info: dict[str, Any], obs: str, completed: bool) -> dict[str, Any]:
        score = int(engine_info["score"])
        return {"admissible_actions": list(engine_info["valid"]), "won": score >= WIN_SCORE,
                "task": task_line(engine_info["taskDesc"]), "task_type": self.task_type, "depth": None,
                "noop": obs.strip() == NOT_UNDERSTOOD, "task_score": score, "completed": completed,
                "variation": self.variation, "moves": int(engine_info["moves"])}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        obs, reward, completed, engine_info = self.engine.step(action)
        self.score = int(engine_info["score"])
        return obs, float(reward), bool(completed), self._info(engine_info, obs, bool(completed))

    def expert_actions(self) -> list[str]:
        """The engine's gold action sequence for this variation, from the state right after reset."""
        if self.task_type is None:
            raise RuntimeError("scienceworld: expert_actions() called before reset()")
        if not self.gold_loaded:
            if self.steps_taken:
                raise RuntimeError("scienceworld: expert_actions() plans from the reset state; call it before step()")
            self._load(gold=True)
        return [str(action) for action in self.engine.get_gold_action_sequence()]

    def close(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.close()
        super().close()
