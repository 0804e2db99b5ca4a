"""One episode in flight: its env instance, what it has seen and done, and its step records.

The rollout engine keeps one :class:`Episode` per env instance it drives and advances all of them
together, one generate call and one batched env step at a time (:meth:`RolloutEngine.advance`);
each episode turns its response and the environment's answer into one StepBatch record
(:meth:`Episode.take_step`) and, once done, into an :class:`EpisodeResult`. A synchronous rollout
starts a wave of episodes together; the streaming pool (:mod:`agentrl.rollout.group_pool`) starts
new ones while others are half-way through, which the per-episode state allows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agentrl.envs.base import TaskRef
from agentrl.rollout.prompts import History
from agentrl.rollout.prompts import task_text as prompt_task_text


@dataclass(frozen=True)
class StepReward:
    """The parts of one step's reward, as the StepBatch stores them."""

    env_reward: float
    invalid_penalty: float = 0.0
    noop_penalty: float = 0.0

    @property
    def total(self) -> float:
        return self.env_reward - self.invalid_penalty - self.noop_penalty

    def columns(self) -> dict[str, float]:
        return {"env_reward": self.env_reward, "invalid_penalty": self.invalid_penalty,
                "noop_penalty": self.noop_penalty}


@dataclass
class EpisodeResult:
    """What one trajectory did (metrics, evaluation tables)."""

    group_id: int
    traj_id: int
    task: TaskRef
    task_type: str
    won: bool
    episode_return: float
    length: int
    invalid_actions: int
    env_error: str | None = None
    score: float | None = None                      # info["task_score"] at the last step, if any
    transcript: list[dict[str, Any]] | None = None  # only with record_transcripts=True

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["task"] = self.task.to_dict()
        return out


@dataclass
class Episode:
    """The state of one episode on one env instance.

    ``first_obs``/``first_info`` are what the reset returned (the task line of every prompt is read
    from them); ``obs``/``info`` the latest observation; ``records`` one dict per step in the
    StepBatch's record format (:meth:`StepBatch.from_records`), completed with ``success`` and
    ``episode_return`` by :meth:`finish`.
    """

    task: TaskRef
    group_id: int
    traj_id: int
    instance_id: int
    first_obs: str = ""
    first_info: dict[str, Any] = field(default_factory=dict)
    obs: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    task_type: str = ""
    history: History = field(default_factory=History)
    won: bool = False
    total: float = 0.0
    invalid: int = 0
    length: int = 0
    error: str | None = None
    done: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)
    transcript: list[dict[str, Any]] | None = None

    @classmethod
    def started(cls, task: TaskRef, group_id: int, traj_id: int, instance_id: int, reset,
                transcript: bool = False) -> "Episode":
        """The episode as its instance's reset left it (a failed reset ends it at once, with the error)."""
        episode = cls(task, group_id, traj_id, instance_id, first_obs=reset.obs, first_info=reset.info,
                      obs=reset.obs, info=reset.info, task_type=str(reset.info.get("task_type", "")),
                      error=reset.error, transcript=[] if transcript else None)
        episode.done = not reset.ok
        return episode

    def prompt_text(self, engine) -> str:
        """The user message of this step (task, history window, observation, admissible actions)."""
        task = prompt_task_text(engine.env_name, self.first_obs, self.first_info, self.info)
        return engine.prompt_text(task, self.obs, self.history, self.info.get("admissible_actions") or [])

    def take_step(self, engine, prompt: list[int], generation, response: str, parsed, result, version: int,
                  versions: list[int] | None) -> bool:
        """Record one step: the prompt, the sampled response (``versions``: the policy version of each
        of its tokens when they differ from ``version``), the env's answer ``result``, the reward parts.
        True when the action was valid and changed nothing (``info["noop"]``)."""
        won_now = bool(result.info.get("won", False))
        noop = parsed.valid and result.ok and bool(result.info.get("noop"))
        reward = engine.step_reward(won_now, self.won, result.reward, parsed.valid, noop)
        self.done = result.done or not result.ok or self.length + 1 >= engine.env_cfg.max_steps
        record = {
            "group_id": self.group_id, "traj_id": self.traj_id, "step": self.length, "prompt_ids": prompt,
            "response_ids": generation.token_ids, "response_mask": [1.0] * len(generation.token_ids),
            "rollout_logprobs": generation.logprobs, **reward.columns(), "done": self.done, "anchor_obs": self.obs,
            "action": parsed.action if parsed.valid else "", "action_valid": parsed.valid,
            "task_type": self.task_type, "policy_version": version,
            "hidden": generation.hidden,   # None unless the backend records hidden states (RowInputs)
        }
        if versions is not None:
            record["response_versions"] = versions
        self.records.append(record)
        if self.transcript is not None:
            self.transcript.append({"observation": self.obs, "response": response, "action": parsed.action,
                                    "valid": parsed.valid, "reward": reward.total})
        self.won = won_now
        self.total += reward.total
        self.length += 1
        self.invalid += not parsed.valid
        if not result.ok:
            self.error = result.error
        self.history.add(self.obs, parsed.action)
        self.obs, self.info = result.obs, result.info
        return noop

    def finish(self) -> EpisodeResult:
        """The episode's result; its records get ``success`` and ``episode_return``."""
        for record in self.records:
            record["success"], record["episode_return"] = self.won, self.total
        if self.transcript is not None:
            self.transcript.append({"observation": self.obs})   # what the episode ended on
        return EpisodeResult(self.group_id, self.traj_id, self.task, self.task_type, self.won, self.total,
                             self.length, self.invalid, self.error, score=task_score(self.info),
                             transcript=self.transcript)


def task_score(info: dict[str, Any]) -> float | None:
    value = info.get("task_score") if info else None
    return float(value) if isinstance(value, (int, float)) else None


__all__ = ["Episode", "EpisodeResult", "StepReward", "task_score"]
