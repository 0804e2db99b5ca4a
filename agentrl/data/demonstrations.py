"""Expert demonstrations: (prompt, response) pairs from the environments' solvers.

They are the SFT warm-start data and the text a tiny model's tokenizer is trained on. Each
episode is played by the environment's expert solver and rendered step by step with the same
prompt builder the rollout uses, so SFT sees exactly the prompts RL will show.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, Sequence

from agentrl.envs import TaskRef, make_env
from agentrl.rollout.prompts import History, build_prompt_text, format_response, task_text
from agentrl.rollout.parsing import LOWERCASE_ENVS


@dataclass(frozen=True)
class Demonstration:
    prompt: str          # user-message text (before the chat template)
    response: str        # the well-formed response with the expert action
    task_type: str
    task: TaskRef
    step: int


# (env, kwargs, split, index, prompt settings) -> the episode's demonstrations ([] if the expert lost).
# The tokenizer corpus and SFT play the same expert episodes one after the other; ALFWorld spends
# ~1-3 s loading each game, so the second pass reads them from here.
_EPISODE_CACHE: "OrderedDict[tuple, list[Demonstration]]" = OrderedDict()
EPISODE_CACHE_SIZE = 8192


def expert_episodes(env_name: str, env_kwargs: dict, split: str, indices: Sequence[int], *, history_length: int,
                    think: bool, style: str, show_admissible: bool = True,
                    count_repeats: bool = False) -> Iterator[Demonstration]:
    """Play the expert on each task and yield one demonstration per step (only won episodes).

    Episodes already played in this process with the same settings come from a cache.
    """
    settings = (env_name, tuple(sorted((k, repr(v)) for k, v in env_kwargs.items())), split, history_length, think,
                style, show_admissible, count_repeats)
    env = None
    for index in indices:
        key = settings + (int(index),)
        if key in _EPISODE_CACHE:
            _EPISODE_CACHE.move_to_end(key)
        else:
            env = env or make_env(env_name, **dict(env_kwargs))
            _EPISODE_CACHE[key] = _play_expert(env, env_name, TaskRef(split, int(index)), history_length, think,
                                               style, show_admissible, count_repeats)
            if len(_EPISODE_CACHE) > EPISODE_CACHE_SIZE:
                _EPISODE_CACHE.popitem(last=False)
        yield from _EPISODE_CACHE[key]


def _play_expert(env, env_name: str, task: TaskRef, history_length: int, think: bool, style: str,
                 show_admissible: bool, count_repeats: bool) -> list[Demonstration]:
    obs, info = env.reset(task)
    task_line = task_text(env_name, obs, info)
    history, steps = History(), []
    for step, action in enumerate(env.expert_actions()):
        admissible = info["admissible_actions"] if show_admissible else []
        prompt = build_prompt_text(env_name, task_line, obs, history, admissible,
                                   history_length=history_length, think=think, style=style,
                                   count_repeats=count_repeats)
        shown = action.lower() if env_name in LOWERCASE_ENVS else action
        thought = f"The next step toward the goal is: {shown}." if think else None
        steps.append(Demonstration(prompt, format_response(shown, thought), str(info["task_type"]), task, step))
        history.add(obs, shown)
        obs, _reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return steps if info.get("won") else []


def demonstration_env_kwargs(cfg) -> dict:
    """The env settings expert episodes are played with: the run's ``env.max_steps`` and ``env.kwargs``."""
    return {"max_steps": cfg.env.max_steps, **cfg.env.kwargs}


def corpus_texts(env_name: str, env_kwargs: dict, split: str, num_tasks: int, *, history_length: int, think: bool,
                 style: str, show_admissible: bool = True, split_size: int | None = None,
                 count_repeats: bool = False) -> list[str]:
    """Texts for tokenizer training: rendered prompts and responses of expert episodes."""
    env = make_env(env_name, **dict(env_kwargs))
    size = split_size or env.split_sizes()[split]
    indices = range(min(num_tasks, size))
    return [f"user\n{d.prompt}\nassistant\n{d.response}\n" for d in
            expert_episodes(env_name, env_kwargs, split, indices, history_length=history_length, think=think,
                            style=style, show_admissible=show_admissible, count_repeats=count_repeats)]
