"""Fault-injection pieces shared by the reliability tests (test-only, never used by the package).

* :class:`FaultEnv` (``test-fault``): a tiny real environment; task ``(tasks, i)`` is won at its
  third step whatever the action. On the step number named by ``hang_step`` / ``die_step`` /
  ``raise_step`` it sleeps ``hang_s`` seconds, ends its whole process, or raises, once per marker
  file in ``once_dir`` (so a restarted process or a re-run episode does not fail again).
* :class:`ScriptedTextBackend`: a labelled test backend that answers each prompt with given text
  (one fixed response, or the next item of a list) and may call a hook before a chosen generate
  call (to kill a server process at a known moment of the rollout).
* :func:`record_figures`: prints one ``FIGURES`` line per test and appends it to the file named by
  ``$AGENTRL_RELIABILITY_FIGURES`` (docs/reliability.md quotes a run of these).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from agentrl.envs import register_env
from agentrl.envs.base import TaskRef, TextEnv
from agentrl.generation.base import Generation, GenerationBackend, SamplingParams


def _first_time(once_dir: str | None, name: str) -> bool:
    if not once_dir:
        return True
    try:
        os.close(os.open(Path(once_dir) / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


class FaultEnv(TextEnv):
    name = "test-fault"

    def __init__(self, max_steps: int = 5, hang_step: int = -1, hang_s: float = 3.0, die_step: int = -1,
                 raise_step: int = -1, once_dir: str | None = None, fault_task: int = 0):
        super().__init__(max_steps=max_steps)
        self.hang_step, self.hang_s, self.die_step, self.raise_step = hang_step, hang_s, die_step, raise_step
        self.once_dir, self.fault_task = once_dir, fault_task
        self._index, self._t = 0, 0

    def split_sizes(self) -> dict[str, int]:
        return {"tasks": 8}

    def _reset_task(self, task: TaskRef) -> tuple[str, dict[str, Any]]:
        self._index, self._t = task.index, 0
        return f"task {task.index}", {"admissible_actions": ["wait"], "task": f"task {task.index}"}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self._t += 1
        if self._index == self.fault_task:
            if self._t == self.hang_step and _first_time(self.once_dir, "hang"):
                time.sleep(self.hang_s)
            if self._t == self.die_step and _first_time(self.once_dir, "die"):
                os._exit(3)
            if self._t == self.raise_step and _first_time(self.once_dir, "raise"):
                raise RuntimeError("injected engine fault")
        won = self._t >= 3
        return f"step {self._t} of task {self._index}", float(won), won, {"won": won}

    def expert_actions(self) -> list[str]:
        return ["wait"] * 3


register_env("test-fault")(FaultEnv)


class ScriptedTextBackend(GenerationBackend):
    """Test-only backend: returns the token ids of scripted texts (not a model)."""

    name = "scripted-text (test only)"

    def __init__(self, tokenizer, texts: str | Sequence[str], hook: Callable[[int], None] | None = None,
                 raw_ids: Sequence[Sequence[int]] | None = None):
        self.tokenizer = tokenizer
        self.texts = [texts] if isinstance(texts, str) else list(texts)
        self.raw_ids = [list(r) for r in raw_ids] if raw_ids else None
        self.hook = hook
        self.calls = 0
        self._next = 0

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        if self.hook is not None:
            self.hook(self.calls)
        self.calls += 1
        out = []
        for _ in prompt_ids:
            if self.raw_ids:
                tokens = self.raw_ids[self._next % len(self.raw_ids)]
            else:
                text = self.texts[self._next % len(self.texts)]
                tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [sampling.stop_token_ids[0]]
            self._next += 1
            out.append(Generation(list(tokens), [0.0] * len(tokens), "stop"))
        return out

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError("the scripted test backend has no weights")


VALID = "<think>go on</think><action>wait</action>"


def record_figures(fault: str, **figures: Any) -> None:
    line = json.dumps({"fault": fault, **figures}, sort_keys=False)
    print(f"FIGURES {line}")
    target = os.environ.get("AGENTRL_RELIABILITY_FIGURES")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(line + "\n")
