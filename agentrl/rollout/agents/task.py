"""Agents as plug-ins (``rollout.agent=my_package.my_module:run_episode``), like estimators.

An agent is a function (or a class whose instances are called) that plays one episode:

    def run_episode(task: AgentTask) -> float | dict:
        client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key)
        obs, info = task.env.reset()                       # agentrl's environment, if the agent uses it
        ...  client.chat.completions.create(model=task.model, messages=...)  ...
        return {"reward": 1.0, "won": True}                # or just the reward

It gets an :class:`AgentTask` and returns the episode's reward: a number, or a dict with ``reward``,
optionally ``won`` (default: reward > 0), ``step_rewards`` (one per model call; without it the
reward is given at the last call), ``step_valid`` (one bool per model call: whether the call gave a
valid action, for ``action_valid`` and the invalid-action counts; default: its tool calls parsed) and ``score`` (the task score ``agentrl eval`` logs; default: the
environment's ``info["task_score"]`` at the agent's last ``task.env`` step, else 1 for a win, 0
otherwise). Every model call through the task's key is one step of the episode
(:mod:`agentrl.gateway.episodes`). An agent that raises, does not return within
``rollout.agent_timeout_s``, returns no reward, makes no model call or breaks its budget costs its
episode, never the run: the episode is re-run or masked (``rollout.on_env_failure``) as for an
environment failure.
"""

from __future__ import annotations

import importlib
import inspect
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrl.envs.base import TaskRef
from agentrl.errors import UsageError
from agentrl.gateway.episodes import EnvCallError


class AgentError(RuntimeError):
    """An agent's episode failed (the message says how); the run goes on."""


class EnvSessionError(AgentError, EnvCallError):
    """The episode's environment call failed: the agent's episode fails, and the gateway's env proxy
    (an agent in a process of its own) answers 502."""


class EnvSession:
    """One agentrl environment instance for an agent: ``reset()`` the episode's task, ``step(action)``.

    It keeps what the engine reports about the episode: the last observation and info (the task score,
    the transcript's last observation) and each action with the number of model calls made before it
    (``calls``: the episode's call count, read at each step), which places it after its call in the
    transcript."""

    def __init__(self, client: Any, instance_id: int, task: TaskRef, timeout: float | None = None,
                 calls: Callable[[], int] | None = None):
        self.client, self.instance_id, self.task, self.timeout = client, int(instance_id), task, timeout
        self.calls = calls
        self.last_obs: str | None = None
        self.last_info: dict[str, Any] = {}
        self.actions: list[tuple[int, str]] = []       # (model calls made before it, action)

    def reset(self) -> tuple[str, dict[str, Any]]:
        result = self.client.reset([(self.instance_id, self.task)], timeout=self.timeout, on_shard_error="report")[0]
        if not result.ok:
            raise EnvSessionError(f"env reset failed: {result.error}")
        self.last_obs, self.last_info, self.actions = result.obs, result.info or {}, []
        return result.obs, result.info

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.actions.append((self.calls() if self.calls else 0, action))
        result = self.client.step([(self.instance_id, action)], timeout=self.timeout, on_shard_error="report")[0]
        if not result.ok:
            raise EnvSessionError(f"env step failed: {result.error}")
        self.last_obs, self.last_info = result.obs, result.info or {}
        return result.obs, float(result.reward), bool(result.terminated or result.truncated), result.info


@dataclass
class AgentTask:
    """What an agent gets for one episode."""

    task: TaskRef                   # the task (split, index) this episode plays; its group plays the same
    base_url: str                   # the gateway's OpenAI-compatible endpoint (.../v1)
    api_key: str                    # this episode's key: every call made with it is a step of this episode
    model: str                      # the model name to send (any name is accepted)
    env: EnvSession | None          # agentrl's environment for this task, when the run has one
    max_steps: int                  # model calls the episode may make (more fail it)
    seed: int = 0
    env_name: str = ""
    traj_id: int = 0                # this episode's trajectory id in the batch (a re-run keeps it)
    extra: dict[str, Any] = field(default_factory=dict)

    def openai_client(self, **options: Any) -> Any:
        """An ``openai.OpenAI`` client for this episode (its base URL and key, no retries: a retried call
        would be a second step), sharing one connection pool with every episode of this process.
        Building a client of one's own costs ~30 ms of CPU (its HTTP client's TLS setup), about twice
        what the gateway spends on a call; ``options`` go to ``with_options`` (``timeout``, ...)."""
        return _shared_openai().with_options(base_url=self.base_url, api_key=self.api_key, **options)


_SHARED: dict[str, Any] = {}
_SHARED_LOCK = threading.Lock()


def _shared_openai() -> Any:
    with _SHARED_LOCK:
        if "openai" not in _SHARED:
            import openai

            _SHARED["openai"] = openai.OpenAI(base_url="http://127.0.0.1/v1", api_key="per-episode", max_retries=0,
                                              timeout=600.0)
        return _SHARED["openai"]


@dataclass
class AgentOutcome:
    reward: float
    won: bool
    step_rewards: list[float] | None = None
    step_valid: list[bool] | None = None    # whether each call gave a valid action, as the agent judged
    score: float | None = None          # the task score (WebShop's purchase score), if the agent gives one


def load_agent(spec: str) -> Callable[[AgentTask], Any]:
    """``module:attribute`` (a function, or a class instantiated once without arguments)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"rollout.agent={spec!r}: give module:function, e.g. my_agents.shop:run_episode")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UsageError(f"rollout.agent={spec!r}: cannot import {module_name} ({err}); put it on PYTHONPATH or "
                         "install its package") from err
    target = getattr(module, attribute, None)
    if target is None:
        raise UsageError(f"rollout.agent={spec!r}: {module_name} has no {attribute}")
    if inspect.isclass(target):
        target = target()
    if not callable(target):
        raise UsageError(f"rollout.agent={spec!r}: {attribute} is not callable")
    return target


def outcome_of(value: Any, calls: int) -> AgentOutcome:
    """The agent's return value as an outcome (:class:`AgentError` when it is none)."""
    if isinstance(value, bool) or value is None:
        raise AgentError(f"the agent returned {value!r}, not a reward (return a number or {{'reward': ...}})")
    if isinstance(value, (int, float)):
        value = {"reward": value}
    if not isinstance(value, dict) or "reward" not in value:
        raise AgentError(f"the agent returned {type(value).__name__}, not a reward (return a number or {{'reward': ...}})")
    reward = value["reward"]
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise AgentError(f"the agent's reward {reward!r} is not a finite number")
    steps = value.get("step_rewards")
    if steps is not None:
        if not isinstance(steps, list) or len(steps) != calls or not all(
                isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) for r in steps):
            raise AgentError(f"step_rewards must be {calls} finite numbers, one per model call; got {steps!r}")
        steps = [float(r) for r in steps]
    valid = value.get("step_valid")
    if valid is not None:
        if not isinstance(valid, list) or len(valid) != calls or not all(isinstance(v, bool) for v in valid):
            raise AgentError(f"step_valid must be {calls} booleans, one per model call; got {valid!r}")
    won, score = value.get("won"), value.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                              or not math.isfinite(score)):
        raise AgentError(f"the agent's score {score!r} is not a finite number")
    return AgentOutcome(float(reward), bool(won) if won is not None else reward > 0, steps, valid,
                        float(score) if score is not None else None)


__all__ = ["AgentError", "AgentOutcome", "AgentTask", "EnvSession", "EnvSessionError", "load_agent", "outcome_of"]
