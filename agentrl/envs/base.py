"""The one protocol every agentrl environment speaks.

An environment is a :class:`gymnasium.Env` with text observation and action spaces:

* ``reset(task) -> (obs, info)`` where ``task`` is a :class:`TaskRef` ``(split, index)``;
* ``step(action_text) -> (obs, reward, terminated, truncated, info)``.

``info`` always carries the keys of :data:`REQUIRED_INFO_KEYS`:

``admissible_actions``  list of valid command strings in the current state (may be empty when the
                        environment has no finite action list, e.g. WebShop's free-text search).
``won``                 True once the task is solved.
``task``                the task instruction as text (what the prompt shows as the goal).
``task_type``           a short category name (ALFWorld task family, WebShop category, TextCraft
                        ``depth{d}``), used for per-type metrics and the papers' tables.
``split``, ``index``    the task address.
``depth``               recipe depth (TextCraft) or a comparable difficulty level; ``None`` if the
                        environment has none.
``noop``                True when the environment reports that the last action changed nothing
                        (ALFWorld's ``Nothing happens.``, TextCraft's ``Could not ...`` replies);
                        False after reset and for environments that cannot tell.

Tasks are addressed by ``(split, index)`` and the split contents are identical on every machine
(sorted listings, seeded shuffles). The G environments of a group get the same ``TaskRef`` and so
the same initial state.

Every environment also implements :meth:`TextEnv.expert_actions`, an expert solver that returns a
winning action sequence for the current task from the state right after ``reset`` (used for SFT
warm-start data and for tests).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from agentrl.errors import UsageError

REQUIRED_INFO_KEYS = ("admissible_actions", "won", "task", "task_type", "split", "index", "depth", "noop")

MAX_TEXT_LENGTH = 1 << 16


@dataclass(frozen=True, order=True)
class TaskRef:
    """Address of one task: the split name and the index inside that split."""

    split: str
    index: int

    def to_dict(self) -> dict[str, Any]:
        return {"split": self.split, "index": int(self.index)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TaskRef":
        return cls(str(data["split"]), int(data["index"]))


class TextEnv(gym.Env, abc.ABC):
    """Base class of agentrl environments (text in, text out).

    Subclasses set :attr:`name`, implement :meth:`split_sizes`, :meth:`_reset_task`,
    :meth:`_step_text` and :meth:`expert_actions`. The base class fills the common ``info`` keys,
    counts steps and applies the step limit (``truncated`` when ``max_steps`` is reached).
    """

    name: str = "textenv"
    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 50):
        if max_steps <= 0:
            raise ValueError(f"max_steps must be positive, got {max_steps}")
        self.max_steps = int(max_steps)
        self.observation_space = gym.spaces.Text(max_length=MAX_TEXT_LENGTH)
        self.action_space = gym.spaces.Text(max_length=MAX_TEXT_LENGTH)
        self.task_ref: TaskRef | None = None
        self.steps_taken = 0
        self.won = False

    # ----- what subclasses provide -------------------------------------------------------------
    @abc.abstractmethod
    def split_sizes(self) -> dict[str, int]:
        """Number of tasks in every split this environment serves."""

    @abc.abstractmethod
    def _reset_task(self, task: TaskRef) -> tuple[str, dict[str, Any]]:
        """Start ``task``; return the initial observation and the task-specific info keys."""

    @abc.abstractmethod
    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one action; return ``(obs, reward, won_or_terminal, info)``."""

    @abc.abstractmethod
    def expert_actions(self) -> list[str]:
        """A winning action sequence for the current task, from the state right after reset."""

    def expert_next_action(self) -> str:
        """The expert's command for the current state, however the agent reached it: the labels of a
        DAgger pass (``trainer.sft.dagger.tasks``), where the policy drives and the expert only
        answers. Environments whose expert is a fixed plan from reset do not provide it."""

        raise UsageError(
            f"env {self.name!r} has no step-wise expert (expert_next_action): its expert only plans from reset, "
            "so it cannot label a policy's states; set trainer.sft.dagger.tasks=0 (ALFWorld provides one)")

    # ----- the protocol ------------------------------------------------------------------------
    def reset(self, task: TaskRef | None = None, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if task is None and options is not None and "task" in options:
            task = options["task"]
        if isinstance(task, dict):
            task = TaskRef.from_dict(task)
        if not isinstance(task, TaskRef):
            raise TypeError(f"reset() needs a TaskRef(split, index), got {task!r}")
        sizes = self.split_sizes()
        if task.split not in sizes:
            raise ValueError(f"unknown split {task.split!r} for env {self.name!r}; "
                             f"available: {sorted(sizes)}")
        if not 0 <= task.index < sizes[task.split]:
            raise ValueError(f"task index {task.index} out of range for split {task.split!r} "
                             f"of env {self.name!r} (0..{sizes[task.split] - 1})")
        self.task_ref = task
        self.steps_taken = 0
        self.won = False
        obs, info = self._reset_task(task)
        return obs, self._complete_info(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task_ref is None:
            raise RuntimeError(f"{self.name}: step() called before reset()")
        if not isinstance(action, str):
            raise TypeError(f"action must be a string, got {type(action).__name__}")
        obs, reward, terminated, info = self._step_text(action)
        self.steps_taken += 1
        self.won = self.won or bool(info.get("won", False))
        truncated = (not terminated) and self.steps_taken >= self.max_steps
        return obs, float(reward), bool(terminated), bool(truncated), self._complete_info(info)

    def _complete_info(self, info: dict[str, Any]) -> dict[str, Any]:
        info = dict(info)
        info.setdefault("admissible_actions", [])
        info["won"] = bool(info.get("won", self.won))
        info.setdefault("task", "")
        info.setdefault("task_type", self.name)
        info.setdefault("depth", None)
        info["noop"] = bool(info.get("noop", False))
        info["split"] = self.task_ref.split
        info["index"] = self.task_ref.index
        return info
