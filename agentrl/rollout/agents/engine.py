"""The rollout engine for agents written outside agentrl (``rollout.agent``): the same calls as
:class:`~agentrl.rollout.engine.RolloutEngine` (``run`` gives a :class:`RolloutResult` whose
StepBatch has one row per model call), with episodes played by the agent through the gateway.

A wave starts one agent thread per episode (its task, a key of its own, one env instance of this
worker when the run has an environment), each against the gateway this engine serves from its
backend, so the calls of all of them are batched into engine calls. Each finished episode's steps
become StepBatch rows: the call's prompt and sampled ids and log-probs, the anchor state, the
reward (``step_rewards`` or the reward at the last call), an invalid-action penalty for a call whose
tool calls were malformed. A failed episode (:mod:`agentrl.rollout.agents.task`) goes through the
engine's recovery (re-run or mask) like an environment failure.

What the gateway samples follows the rollout's settings, whatever the agent asks: temperature,
top-p and top-k of ``rollout.*`` (the learner's log-probs assume them) and at most
``rollout.max_response_tokens`` per call.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from agentrl.data.step_batch import StepBatch
from agentrl.envs.base import TaskRef
from agentrl.errors import UsageError
from agentrl.rollout.agents.processes import AgentProcesses, AgentRun, RemoteEnv
from agentrl.rollout.agents.task import AgentError, AgentTask, EnvSession, close_sessions, load_agent, outcome_of
from agentrl.gateway.episodes import GatewayEpisode
from agentrl.gateway.server import Gateway
from agentrl.generation.base import SamplingParams
from agentrl.rollout.engine import RolloutEngine, RolloutResult, Tally, step_seed
from agentrl.rollout.episode import EpisodeResult, task_score


class AgentEngine(RolloutEngine):
    """:class:`RolloutEngine` whose episodes an agent plays through an OpenAI-compatible gateway."""

    def __init__(self, backend, tokenizer, env_client, rollout_cfg, env_cfg, *, agent, instance_ids=None,
                 stop_strings: Sequence[str] = (), host: str = "127.0.0.1", **kwargs: Any):
        super().__init__(backend, tokenizer, env_client, rollout_cfg, env_cfg, instance_ids=instance_ids,
                         stop_strings=stop_strings, **kwargs)
        # the agent (module:function, or the callable) plays in threads of this process, or in
        # rollout.agent_processes processes of its own (which load it from its name)
        self.agent = load_agent(agent) if isinstance(agent, str) else agent
        self.processes = None
        if getattr(rollout_cfg, "agent_processes", 0):
            if not isinstance(agent, str):
                raise UsageError("rollout.agent_processes needs the agent by name (module:function), which each "
                                 "agent process imports")
            self.processes = AgentProcesses(agent, int(rollout_cfg.agent_processes))
        self.gateway = Gateway(backend, tokenizer, host=host,
                               max_model_len=rollout_cfg.max_prompt_tokens + rollout_cfg.max_response_tokens,
                               default_max_tokens=rollout_cfg.max_response_tokens,
                               stop_token_ids=self.stop_token_ids, max_prompt_tokens=rollout_cfg.max_prompt_tokens,
                               prompt_truncation=rollout_cfg.prompt_truncation)
        # weights that arrived during a wave are loaded between two engine calls; each call's steps carry
        # the version that generated them
        self.gateway.batcher.before_generate = lambda: self.before_generate() if self.before_generate else None
        self.gateway.batcher.version = lambda: self.policy_version
        self.gateway.start_background()

    def _run_wave(self, envs: list[tuple[TaskRef, int, int]], sampling: SamplingParams, seed: int,
                  wave: int) -> RolloutResult:
        start, tally = time.perf_counter(), Tally()
        cuts = (self.gateway.truncated_prompts, self.gateway.dropped_system_messages)
        self.gateway.sampling = sampling
        self.gateway.batcher.next_seed = step_seed(sampling.seed, wave, 0)
        slots = [(task, group_id, traj_id, iid) for (task, group_id, traj_id), iid in zip(envs, self.instance_ids)]
        self.mark(f"agents playing {len(slots)} episodes (env instances {self.instance_ids[:len(slots)]})")
        runs = [self._start(task, traj_id, iid, seed) for task, _, traj_id, iid in slots]
        self.gateway.batcher.expected = lambda: sum(thread.is_alive() for thread, _, _, _ in runs)
        deadline = time.monotonic() + float(self.rollout_cfg.agent_timeout_s)
        for thread, _, _, _ in runs:
            thread.join(max(0.0, deadline - time.monotonic()))
        records, results = [], []
        closed_episodes = [self.gateway.close_episode(episode.key) for _, episode, _, _ in runs]   # late calls: 401
        close_sessions(env for _, _, _, env in runs)      # and task.env refuses them (a timed-out agent's too)
        error, self.gateway.batcher.error = self.gateway.batcher.error, None
        if error is not None:        # the engine failed, not the agents: the rollout fails
            raise RuntimeError(f"the generation engine failed during the agents' wave: {type(error).__name__}: "
                               f"{error}") from error
        for (task, group_id, traj_id, _), (thread, _, box, env), closed in zip(slots, runs, closed_episodes):
            error = box.get("error")
            if thread.is_alive():
                error = f"the agent did not finish within rollout.agent_timeout_s={self.rollout_cfg.agent_timeout_s:g} s"
            elif error is None and closed.failure:
                error = f"the agent's episode failed: {closed.failure}"
            elif error is None and not closed.steps:
                error = "the agent made no model call"
            outcome = None
            if error is None:
                try:
                    outcome = outcome_of(box.get("value"), len(closed.steps))
                except AgentError as err:
                    error = str(err)
            if error is not None:
                results.append(EpisodeResult(group_id, traj_id, task, task.split, False, 0.0, len(closed.steps), 0,
                                             env_error=f"agent: {error}"))
                continue
            rows = self._records(closed, outcome, task, group_id, traj_id)
            records += rows
            score = outcome.score if outcome.score is not None else task_score(env.last_info if env else {})
            results.append(EpisodeResult(group_id, traj_id, task, task.split, outcome.won,
                                         sum(r["env_reward"] - r["invalid_penalty"] for r in rows), len(rows),
                                         sum(not r["action_valid"] for r in rows), score=score,
                                         transcript=self._transcript(closed, rows, env) if self.record_transcripts
                                         else None))
            tally.add("generated_tokens", sum(len(s.response_ids) for s in closed.steps))
            tally.add("env_steps", len(rows))
        tally.add("truncated_prompts", self.gateway.truncated_prompts - cuts[0])    # prompts the gateway cut
        tally.add("dropped_system_messages", self.gateway.dropped_system_messages - cuts[1])
        batch = StepBatch.from_records(records, pad_id=self.pad_id) if records else None
        stats = {**tally.drain(), "episodes": len(envs), "rollout_s": time.perf_counter() - start}
        return RolloutResult(batch, sorted(results, key=lambda r: r.traj_id), stats)

    def _start(self, task: TaskRef, traj_id: int, instance_id: int, seed: int
               ) -> tuple[threading.Thread | AgentRun, GatewayEpisode, dict[str, Any], EnvSession | None]:
        episode = self.gateway.open_episode(f"traj {traj_id}", max_calls=self.env_cfg.max_steps,
                                            max_tokens=self.rollout_cfg.max_prompt_tokens
                                            + self.rollout_cfg.max_response_tokens)
        env = EnvSession(self.client, instance_id, task, self.env_cfg.step_timeout_s,
                         calls=lambda: len(episode.steps)) if self.client else None
        agent_env = env
        if self.processes is not None and env is not None:     # stepped here, through the gateway
            episode.env = env
            agent_env = RemoteEnv(self.gateway.base_url, episode.key, self.env_cfg.step_timeout_s)
        context = AgentTask(task, self.gateway.base_url, episode.key, self.gateway.model_name, agent_env,
                            self.env_cfg.max_steps, seed=seed * 1_000_003 + traj_id, env_name=self.env_name,
                            traj_id=traj_id, extra={"loop": self.loop_settings()})
        if self.processes is not None:
            run = self.processes.start(context)
            return run, episode, run.box, env
        box: dict[str, Any] = {}

        def play() -> None:
            try:
                box["value"] = self.agent(context)
            except BaseException as err:  # noqa: BLE001 - the episode fails, the run goes on
                box["error"] = f"{type(err).__name__}: {err}"

        thread = threading.Thread(target=play, name=f"agent-{traj_id}", daemon=True)
        thread.start()
        return thread, episode, box, env

    def failure_advice(self) -> tuple[str, str]:
        """Episodes fail here because the agent raised, timed out or returned no reward (its error is in
        the line), more rarely because its environment failed under it."""
        name = getattr(self.rollout_cfg, "agent", None) or getattr(self.agent, "__name__", "the agent")
        return (f"the agent (rollout.agent={name}) failed: fix it (run it on one task), raise "
                "rollout.agent_timeout_s if it ran out of time, or raise rollout.max_env_failures",
                "the agent is fixed")

    def loop_settings(self) -> dict[str, Any]:
        """agentrl's own loop's prompt and reward settings, for an agent that mirrors it
        (``AgentTask.extra["loop"]``; the example agents read them)."""
        rollout, env = self.rollout_cfg, self.env_cfg
        return {"history_length": env.history_length, "think": rollout.enable_thinking, "style": rollout.prompt_style,
                "count_repeats": env.history_count_repeats, "show_admissible": rollout.show_admissible,
                "success_reward": env.success_reward, "reward": env.reward,
                "invalid_action_penalty": rollout.invalid_action_penalty}

    def _records(self, episode: GatewayEpisode, outcome, task: TaskRef, group_id: int, traj_id: int
                 ) -> list[dict[str, Any]]:
        steps = episode.steps
        rewards = outcome.step_rewards or [0.0] * (len(steps) - 1) + [outcome.reward]
        penalty = float(self.rollout_cfg.invalid_action_penalty)
        valid = outcome.step_valid or [True] * len(steps)     # the agent's judgement, and the tool calls parsed
        return [{"group_id": group_id, "traj_id": traj_id, "step": i, "prompt_ids": s.prompt_ids,
                 "response_ids": s.response_ids, "rollout_logprobs": s.logprobs, "env_reward": rewards[i],
                 "invalid_penalty": penalty if s.invalid_tool_calls else 0.0, "done": i == len(steps) - 1,
                 "success": outcome.won, "anchor_obs": s.anchor, "action_valid": s.invalid_tool_calls == 0 and valid[i],
                 "policy_version": s.policy_version, "task_type": task.split, "action": ""}
                for i, s in enumerate(steps)]

    def _transcript(self, episode: GatewayEpisode, rows: list[dict[str, Any]], env: EnvSession | None
                    ) -> list[dict[str, Any]]:
        """``agentrl eval``'s transcript of an agent's episode: per model call its anchor state (the
        observation), the reply's text, whether its tool calls parsed, its reward, and the environment
        action(s) the agent sent before its next call (through ``task.env``); then the observation the
        episode ended on, when the agent used ``task.env``."""
        out = []
        for i, (step, row) in enumerate(zip(episode.steps, rows)):
            entry = {"observation": step.anchor, "response": self.tokenizer.decode(step.response_ids,
                                                                                   skip_special_tokens=True),
                     "valid": row["action_valid"], "reward": row["env_reward"] - row["invalid_penalty"]}
            actions = [a for calls, a in (env.actions if env else []) if calls == i + 1]
            if len(actions) == 1:
                entry["action"] = actions[0]
            elif actions:
                entry["actions"] = actions
            out.append(entry)
        if env is not None and env.last_obs is not None:
            out.append({"observation": env.last_obs})
        return out

    def close(self) -> None:
        if self.processes is not None:
            self.processes.close()
        self.gateway.close()


__all__ = ["AgentEngine"]
