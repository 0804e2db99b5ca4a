"""Expert demonstrations: (prompt, response) pairs from the environments' solvers.

They are the SFT warm-start data and the text a tiny model's tokenizer is trained on. Each
episode is played by the environment's expert solver and rendered step by step with the same
prompt builder the rollout uses, so SFT sees exactly the prompts RL will show.

Recovery variants (``trainer.sft.recovery.variants``) add episodes in which the expert does the
last action of a run once too often, as a policy that lost count does (TextCraft's ninth ``craft 1
gold ingot`` from 72 nuggets), and then goes on with its plan. Only the steps after that extra
action become demonstrations: the policy learns what to do once it has overshot, never the
overshoot itself (noise injection into expert demonstrations, as in DART).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, Sequence

from agentrl.envs import TaskRef, make_env
from agentrl.errors import UsageError
from agentrl.rollout.parsing import parse_response, shown_action
from agentrl.rollout.prompts import History, build_prompt_text, format_response, task_text
from agentrl.runs.task_schedule import TaskSchedule
from agentrl.warmstart.process_pool import spawned_pool


@dataclass(frozen=True)
class Demonstration:
    prompt: str          # user-message text (before the chat template)
    response: str        # the well-formed response with the expert action
    task_type: str
    task: TaskRef
    step: int
    recovery: bool = False   # a step after an injected extra action (recovery variant)
    dagger: bool = False     # a state the policy reached, labelled by the expert (agentrl.warmstart.dagger)
    previous_action: str = ""  # the action taken just before this state ("" at the first step)


# (env, kwargs, split, index, prompt settings) -> the episode's demonstrations ([] if the expert lost).
# The tokenizer corpus and SFT play the same expert episodes one after the other; ALFWorld spends
# ~1-3 s loading each game, so the second pass reads them from here.
_EPISODE_CACHE: "OrderedDict[tuple, list[Demonstration]]" = OrderedDict()
EPISODE_CACHE_SIZE = 8192


def expert_episodes(env_name: str, env_kwargs: dict, split: str, indices: Sequence[int], *, history_length: int,
                    think: bool, style: str, show_admissible: bool = True,
                    count_repeats: bool = False, recovery_variants: int = 0,
                    workers: int = 1) -> Iterator[Demonstration]:
    """Play the expert on each task and yield one demonstration per step (only won episodes), then
    those of up to ``recovery_variants`` recovery variants of the episode (see the module text).

    Episodes already played in this process with the same settings come from a cache. With
    ``workers`` > 1 the episodes not in it are first played in that many processes (each with its
    own env; ALFWorld spends ~0.6-3 s loading a game); the demonstrations are the same either way.
    """
    settings = (env_name, tuple(sorted((k, repr(v)) for k, v in env_kwargs.items())), split, history_length, think,
                style, show_admissible, count_repeats, recovery_variants)
    prompt = dict(history_length=history_length, think=think, style=style, count_repeats=count_repeats)
    if workers > 1:
        missing = list(dict.fromkeys(int(i) for i in indices if settings + (int(i),) not in _EPISODE_CACHE))
        if len(missing) > 1:
            for index, demos in _play_in_processes(env_name, env_kwargs, split, missing, prompt, show_admissible,
                                                   recovery_variants, workers):
                _remember(settings + (index,), demos)
    env = None
    for index in indices:
        key = settings + (int(index),)
        if key in _EPISODE_CACHE:
            _EPISODE_CACHE.move_to_end(key)
        else:
            env = env or make_env(env_name, **dict(env_kwargs))
            _remember(key, _play_expert(env, env_name, TaskRef(split, int(index)), prompt, show_admissible,
                                        recovery_variants))
        yield from _EPISODE_CACHE[key]


def _remember(key: tuple, demos: list[Demonstration]) -> None:
    _EPISODE_CACHE[key] = demos
    if len(_EPISODE_CACHE) > EPISODE_CACHE_SIZE:
        _EPISODE_CACHE.popitem(last=False)


def _play_in_processes(env_name: str, env_kwargs: dict, split: str, indices: list[int], prompt: dict,
                       show_admissible: bool, recovery_variants: int, workers: int):
    """``(index, demonstrations)`` of every index, played in ``workers`` spawned processes, each
    taking every ``workers``-th index (games of one family are spread evenly)."""

    workers = min(workers, len(indices))
    chunks = [indices[w::workers] for w in range(workers)]
    with spawned_pool(workers, f"{env_name}'s expert demonstrations") as pool:
        futures = [pool.submit(_play_chunk, env_name, dict(env_kwargs), split, chunk, prompt, show_admissible,
                               recovery_variants) for chunk in chunks]
        for future in futures:
            yield from future.result()


def _play_chunk(env_name: str, env_kwargs: dict, split: str, indices: list[int], prompt: dict,
                show_admissible: bool, recovery_variants: int) -> list[tuple[int, list[Demonstration]]]:
    env = make_env(env_name, **env_kwargs)
    return [(index, _play_expert(env, env_name, TaskRef(split, index), prompt, show_admissible, recovery_variants))
            for index in indices]


def _play_expert(env, env_name: str, task: TaskRef, prompt: dict, show_admissible: bool,
                 recovery_variants: int) -> list[Demonstration]:
    """The expert episode's demonstrations, then those of its recovery variants ([] if the expert lost).
    ``prompt``: the keyword arguments of :func:`build_prompt_text` (history, thinking, style)."""
    demos, plan = _play_actions(env, env_name, task, None, 0, prompt, show_admissible)
    if not demos:
        return []
    for end in overshoot_points(plan, recovery_variants):
        actions = plan[:end] + [plan[end - 1]] + plan[end:]
        demos += _play_actions(env, env_name, task, actions, end + 1, prompt, show_admissible)[0]
    return demos


def overshoot_points(plan: Sequence[str], count: int) -> list[int]:
    """Up to ``count`` plan positions where a run of one repeated action ends (``plan[i]`` differs
    from ``plan[i - 1]``): the longest runs first, the latest first among runs as long. A recovery
    variant repeats ``plan[i - 1]`` once more right there."""
    runs, start = [], 0
    for i in range(1, len(plan)):
        if plan[i] != plan[i - 1]:
            runs.append((i - start, i))
            start = i
    runs.sort(key=lambda run: (-run[0], -run[1]))
    return [end for _, end in runs[:max(0, count)]]


def _play_actions(env, env_name: str, task: TaskRef, actions: Sequence[str] | None, train_from: int,
                  prompt: dict, show_admissible: bool) -> tuple[list[Demonstration], list[str]]:
    """Play ``actions`` (None: the expert's plan) from the task's start. Returns the demonstrations
    of steps ``train_from`` on ([] when the episode is not won) and the actions played."""
    obs, info = env.reset(task)
    actions = list(env.expert_actions()) if actions is None else list(actions)
    reset_obs, reset_info = obs, info
    history, steps = History(), []
    for step, action in enumerate(actions):
        shown = shown_action(action, env_name)
        if step >= train_from:
            admissible = info["admissible_actions"] if show_admissible else []
            text = build_prompt_text(env_name, task_text(env_name, reset_obs, reset_info, info), obs, history,
                                     admissible, **prompt)
            thought = f"The next step toward the goal is: {shown}." if prompt["think"] else None
            steps.append(Demonstration(text, format_response(shown, thought), str(info["task_type"]), task, step,
                                       recovery=train_from > 0,
                                       previous_action=history.last_action))
        history.add(obs, shown)
        obs, _reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return (steps if info.get("won") else []), actions


def action_kind(action: str) -> str:
    """An action's kind: its first word (``go``, ``take``, ``craft``, ...; ``""`` for no action)."""
    return (action.split() or [""])[0]


def demonstration_action(demo: Demonstration, env_name: str) -> str:
    """The expert action a demonstration's response holds."""
    return parse_response(demo.response, env_name).action


def repeat_key(demo: Demonstration, env_name: str) -> tuple[str, str | None]:
    """``(kind, "<kind> after <previous kind>")`` of a demonstration: its action's kind, and that
    kind after the kind of the action taken just before its state (None at an episode's first step)."""
    kind = action_kind(demonstration_action(demo, env_name))
    return kind, (f"{kind} after {action_kind(demo.previous_action)}" if demo.previous_action else None)


def repeat_by_action(demos: list[Demonstration], repeats: dict, env_name: str) -> list[Demonstration]:
    """Each demonstration ``repeats[key]`` times in a row, others once:
    ``trainer.sft.balance.action_repeats``, class balance for decisions the expert takes rarely. A key
    is an action kind (:func:`action_kind`: ``take``) or a kind after the kind of the action taken
    just before (``go after take``: ALFWorld's turn from searching to carrying); the second is the
    more specific and wins when both match."""

    for kind, count in repeats.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise UsageError(f"trainer.sft.balance.action_repeats.{kind}={count!r}: expected a whole number >= 1 "
                             "(how many times each such demonstration appears per epoch)")
    if not repeats:
        return list(demos)
    keys = [repeat_key(d, env_name) for d in demos]
    unused = sorted(set(repeats) - {k for pair in keys for k in pair if k})
    if unused:
        raise UsageError(f"trainer.sft.balance.action_repeats names {unused}, which no demonstration matches "
                         f"(actions start with {sorted({kind for kind, _ in keys})}; '<kind> after <kind>' names "
                         f"a kind after the previous action's kind)")
    counts = [repeats.get(after, repeats.get(kind, 1)) for kind, after in keys]
    return [d for d, count in zip(demos, counts) for _ in range(count)]


def demonstration_split(cfg) -> str:
    """The split whose expert episodes SFT and the tokenizer corpus use: ``trainer.sft.split``, or
    ``env.train_split`` when that is unset. A split the environment does not have is a usage error
    naming the key that set it."""

    split, key = (cfg.trainer.sft.split, "trainer.sft.split") if cfg.trainer.sft.split else \
        (cfg.env.train_split, "env.train_split")
    TaskSchedule.checked_split_size(cfg.env, split, key)
    return split


def demonstration_env_kwargs(cfg) -> dict:
    """The env settings expert episodes are played with: the run's ``env.max_steps`` and ``env.kwargs``."""
    return {"max_steps": cfg.env.max_steps, **cfg.env.kwargs}


def corpus_texts(env_name: str, env_kwargs: dict, split: str, num_tasks: int, *, history_length: int, think: bool,
                 style: str, show_admissible: bool = True, split_size: int | None = None,
                 count_repeats: bool = False, recovery_variants: int = 0, workers: int = 1) -> list[str]:
    """Texts for tokenizer training: rendered prompts and responses of expert episodes."""
    env = make_env(env_name, **dict(env_kwargs))
    size = split_size or env.split_sizes()[split]
    indices = range(min(num_tasks, size))
    return [f"user\n{d.prompt}\nassistant\n{d.response}\n" for d in
            expert_episodes(env_name, env_kwargs, split, indices, history_length=history_length, think=think,
                            style=style, show_admissible=show_admissible, count_repeats=count_repeats,
                            recovery_variants=recovery_variants, workers=workers)]
