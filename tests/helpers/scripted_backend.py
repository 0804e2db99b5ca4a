"""A test backend that acts well: it answers every prompt with the expert's next action.

Not a model. It decodes the prompt, finds the task text and the step number (the compact prompt
style says "Last k of n steps"), looks up the expert plan recorded for that task before the
rollout, and returns the well-formed response's token ids (with the stop token) and zero
log-probs. ``invalid_steps`` lists step numbers at which it answers without the action tags, to
exercise the invalid-format penalty; ``noop_steps`` step numbers at which it answers a well-formed
command the environment rejects (``NOOP_ACTION``: TextCraft's ``Could not execute ...``).
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

import torch

from agentrl.envs import TaskRef, make_env
from agentrl.generation.base import Generation, GenerationBackend, SamplingParams
from agentrl.rollout.parsing import shown_action
from agentrl.rollout.prompts import format_response

_TASK = re.compile(r"Task: (.*?)\n", re.S)
_STEPS = re.compile(r"Last \d+ of (\d+) steps")
NOOP_ACTION = "dance"


def expert_plans(env_name: str, tasks: Sequence[TaskRef], env_kwargs: dict | None = None) -> dict[str, list[str]]:
    """Task text -> the expert's action sequence, played from a fresh reset."""
    env = make_env(env_name, **dict(env_kwargs or {}))
    plans = {}
    for task in tasks:
        _, info = env.reset(task)
        actions = env.expert_actions()
        plans[info["task"]] = [shown_action(a, env_name) for a in actions]
    return plans


class ScriptedExpertBackend(GenerationBackend):
    name = "scripted-expert (test only)"

    def __init__(self, tokenizer, plans: dict[str, list[str]], invalid_steps: Sequence[int] = (),
                 noop_steps: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.plans = plans
        self.invalid_steps = set(invalid_steps)
        self.noop_steps = set(noop_steps)
        self.calls = 0

    def _respond(self, prompt: str) -> str:
        # the plan whose task line the prompt shows (TextCraft's task is its whole first observation)
        task = next((t for t in self.plans if t in prompt), None) or _TASK.search(prompt).group(1)
        steps = _STEPS.search(prompt)
        step = int(steps.group(1)) if steps else 0
        if step in self.invalid_steps:
            return "I will just wait here"
        if step in self.noop_steps:
            return format_response(NOOP_ACTION, "trying something else")
        plan = self.plans[task]
        done = step - sum(1 for s in self.invalid_steps | self.noop_steps if s < step)  # plan steps already taken
        return format_response(plan[min(done, len(plan) - 1)], "following the plan")

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        self.calls += 1
        out = []
        for ids in prompt_ids:
            text = self._respond(self.tokenizer.decode(list(ids), skip_special_tokens=False))
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [sampling.stop_token_ids[0]]
            out.append(Generation(tokens, [0.0] * len(tokens), "stop"))
        return out

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError("the scripted test backend has no weights")
