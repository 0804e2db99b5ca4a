"""The multi-turn rollout engine: N = tasks x G environments, one StepBatch record per env step.

One call of :meth:`RolloutEngine.run`::

    reset every env (the G envs of a task share the TaskRef, so they start in the same state)
    while some env is active:
        prompt_i  = chat_template(build_prompt_text(task, last K (obs, action), obs, admissible))
        responses = backend.generate([prompt_i for active i], sampling)      # one batch
        action_i  = parse_response(response_i)       (<think> required when enable_thinking)
        env.step(action_i) for all active i          (one batched call to the env client)
        record (prompt, response, logprobs, anchor_obs = obs_i, action, env_reward and each
                penalty, done, policy_version, ..., hidden when the backend records it:
                backend.record_hidden)
    number each group's distinct observations (StepBatch.anchor_key)
        finished envs leave the batch

Reward columns of a record (:class:`StepReward`; the StepBatch keeps each part as it was made):

* ``env_reward``: ``env.success_reward`` at the step where ``info["won"]`` first becomes true, 0
  otherwise (``env.reward == "success"``), or the environment's own reward (``"env"``);
* ``invalid_penalty``: ``rollout.invalid_action_penalty`` when the response did not parse
  (``action_valid`` false), else 0. An invalid response still sends the parser's fallback text to
  the environment;
* ``noop_penalty``: ``rollout.noop_penalty`` when a parsed action changed nothing
  (``info["noop"]``: ALFWorld's ``Nothing happens.``), else 0. Off (0) by default, as in the
  reference framework.

The step's reward is ``env_reward - invalid_penalty - noop_penalty``. ``success`` is
``info["won"]`` at the last step, ``episode_return`` the sum of the rewards,
``score`` the environment's own task score at the last step (``info["task_score"]``, WebShop's
purchase score; None when the environment reports none).

Transcripts are opt-in (``record_transcripts=True``, e.g. for ``agentrl eval``): each
:class:`EpisodeResult` then carries the observations the policy saw, its raw responses and the
parsed actions. Training rollouts leave it off and keep only the ids and numbers.
A prompt longer than ``rollout.max_prompt_tokens`` raises :class:`PromptTooLongError` or keeps
its last tokens (``rollout.prompt_truncation = "left"``).

When more envs are asked for than the client's instances, whole groups run in waves.

An episode that an environment failure ends (``EpisodeResult.env_error``: the instance raised or
hung and was rebuilt, or its shard died or did not answer) is re-run from reset or masked out of
the batch (``rollout.on_env_failure``); the counts are in ``stats`` (``env_failures``,
``episodes_rerun``, ``episodes_masked``), and more than ``rollout.max_env_failures`` failed
episodes in one call raise :class:`EnvFailureLimitError`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from agentrl.data.step_batch import StepBatch
from agentrl.envs.base import TaskRef
from agentrl.generation.base import Generation, GenerationBackend, SamplingParams
from agentrl.models import stop_token_ids as default_stop_ids
from agentrl.rollout.episode import Episode, EpisodeResult, StepReward
from agentrl.rollout.guidance import all_failed_groups, play_guided_episodes
from agentrl.rollout.parsing import parse_response
from agentrl.rollout.prompts import History, build_prompt_text, render_chat

_SEED_MASK = (1 << 62) - 1


class PromptTooLongError(ValueError):
    """A step prompt is longer than ``rollout.max_prompt_tokens`` and truncation is ``error``."""


class EnvFailureLimitError(RuntimeError):
    """More episodes of one rollout failed in their environments than ``rollout.max_env_failures``.
    ``resume_when``: what must be healthy again before a resumed run goes on (the stop line names it)."""

    def __init__(self, message: str, resume_when: str = "the env servers are healthy"):
        super().__init__(message)
        self.resume_when = resume_when

    def __reduce__(self):      # through Ray: keep resume_when
        return type(self), (str(self), self.resume_when)


RERUN_WAVE_STRIDE = 1000   # a re-run wave samples with seeds of its own
RERUN_PAUSE_S = 0.5        # pause before the first re-run wave; doubled for each further one (max 5 s)


@dataclass
class RolloutResult:
    batch: StepBatch
    episodes: list[EpisodeResult]
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        return sum(e.won for e in self.episodes) / max(1, len(self.episodes))

    @staticmethod
    def merge(results: Sequence["RolloutResult"]) -> "RolloutResult":
        """Results of disjoint rollouts (distinct group/traj ids) as one, in trajectory order.

        Counters and times are summed (``max_*`` entries take the maximum)."""
        if not results:
            raise ValueError("nothing to merge")
        batch = StepBatch.concat([r.batch for r in results])
        episodes = sorted((e for r in results for e in r.episodes), key=lambda e: e.traj_id)
        stats: dict[str, float] = {}
        for r in results:
            for k, v in r.stats.items():
                stats[k] = max(stats.get(k, 0.0), v) if k.startswith("max_") else stats.get(k, 0.0) + v
        return RolloutResult(batch, episodes, stats)


def make_sampling_params(rollout_cfg, stop_token_ids: Sequence[int], stop_strings: Sequence[str] = (),
                         temperature: float | None = None, seed: int = 0) -> SamplingParams:
    """Sampling from ``rollout.*``; ``temperature`` overrides (0 = greedy, e.g. for validation)."""
    temp = rollout_cfg.temperature if temperature is None else float(temperature)
    return SamplingParams(max_tokens=rollout_cfg.max_response_tokens, temperature=temp,
                          top_p=rollout_cfg.top_p if temp > 0 else 1.0, top_k=rollout_cfg.top_k if temp > 0 else -1,
                          stop_token_ids=tuple(stop_token_ids), stop_strings=tuple(stop_strings), seed=int(seed))


def encode_prompts(tokenizer, texts: Sequence[str], rollout_cfg, env_name: str) -> tuple[list[list[int]], int]:
    """Chat-templated token ids of user-message texts as the rollout sends them to the backend, cut
    to ``rollout.max_prompt_tokens`` (``prompt_truncation``); also how many were left-truncated."""
    rendered = [render_chat(tokenizer, t) for t in texts]
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    limit = rollout_cfg.max_prompt_tokens
    truncated = 0
    for i, p in enumerate(ids):
        if len(p) <= limit:
            continue
        if rollout_cfg.prompt_truncation != "left":
            raise PromptTooLongError(
                f"a {env_name} prompt has {len(p)} tokens, more than rollout.max_prompt_tokens={limit}; "
                "raise the limit, shorten the prompt (env.history_length, rollout.prompt_style=compact) "
                "or set rollout.prompt_truncation=left to keep its last tokens")
        ids[i] = p[-limit:]
        truncated += 1
    return [list(p) for p in ids], truncated


def step_seed(seed: int, wave: int, step: int) -> int:
    """The sampling seed of one generate call (distinct for every wave and step of a rollout)."""
    return (int(seed) * 1_000_003 + wave * 10_007 + step) & _SEED_MASK


def id_ranges(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``"0-2, 5, 7-8"``."""
    parts, run = [], []
    for i in sorted(ids):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts)


@dataclass
class Activity:
    """What the engine is doing now and since when (``time.monotonic()``): what a worker's
    ``status()`` reports, and what ``rollout.hang_timeout_s`` watches."""

    doing: str = "idle"
    since: float = field(default_factory=time.monotonic)
    env: bool = False       # waiting on the environments (else on the policy or itself)


COUNTERS = ("env_steps", "generated_tokens", "prompt_tokens", "truncated_prompts", "dropped_system_messages",
            "max_prompt_tokens", "invalid_actions", "noop_actions", "env_errors")
TIMES = ("generate_s", "env_s", "prompt_s")


@dataclass
class Tally:
    """Counters and seconds of a stretch of rollout work (``RolloutResult.stats``)."""

    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS + TIMES, 0.0))

    def add(self, key: str, value: float) -> None:
        self.counts[key] = max(self.counts[key], value) if key.startswith("max_") else self.counts[key] + value

    def timed(self, key: str, since: float) -> None:
        self.counts[key] += time.perf_counter() - since

    def drain(self) -> dict[str, float]:
        counts, self.counts = self.counts, dict.fromkeys(COUNTERS + TIMES, 0.0)
        return counts


def step_versions(generation: Generation, version: int) -> tuple[int, list[int] | None]:
    """The policy version of a step (that of its first token) and of each token of ``generation``
    when weights changed during it (a backend that loads weights between tokens reports them; None:
    every token is the step's). ``version`` is the engine's version when the generate call began:
    weights that arrive between then and the first token are already the first token's."""
    versions = getattr(generation, "versions", None)
    if not versions:
        return version, None
    first = int(versions[0])
    return first, (None if all(v == first for v in versions) else list(versions))


class RolloutEngine:
    """Runs groups of episodes of one environment with one generation backend.

    ``env_client`` speaks the :class:`agentrl.envs.server.EnvClient` API (batched ``reset`` and
    ``step`` over instance ids); ``instance_ids`` are the ones this engine may use (default: all
    of the client's). ``rollout_cfg``/``env_cfg`` are :class:`~agentrl.config.schema.RolloutConfig`
    and :class:`~agentrl.config.schema.EnvConfig`. ``record_transcripts`` (default: the
    ``record_transcripts`` attribute of ``rollout_cfg`` when it has one, else off) keeps every
    episode's observations, responses and actions in :attr:`EpisodeResult.transcript`.
    """

    def __init__(self, backend: GenerationBackend, tokenizer, env_client, rollout_cfg, env_cfg, *,
                 env_name: str | None = None, instance_ids: Sequence[int] | None = None,
                 stop_token_ids: Sequence[int] | None = None, stop_strings: Sequence[str] = (),
                 record_transcripts: bool | None = None):
        self.backend = backend
        self.tokenizer = tokenizer
        self.client = env_client
        self.rollout_cfg = rollout_cfg
        self.env_cfg = env_cfg
        self.env_name = env_name or getattr(env_client, "env_name", None) or env_cfg.name
        self.instance_ids = list(instance_ids) if instance_ids is not None else list(range(env_client.size))
        if not self.instance_ids:
            raise ValueError("the rollout engine needs at least one env instance")
        self.stop_token_ids = tuple(stop_token_ids) if stop_token_ids is not None else \
            tuple(default_stop_ids(tokenizer))
        self.stop_strings = tuple(stop_strings)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if record_transcripts is None:
            record_transcripts = bool(getattr(rollout_cfg, "record_transcripts", False))
        self.record_transcripts = record_transcripts
        self.policy_version = 0     # learner updates in the weights the backend runs (set on each sync)
        # called at every step boundary, before a generate call: a worker loads weights that arrived
        # during the rollout here (trainer.mode=async), so an episode may span policy versions
        self.before_generate: Callable[[], None] | None = None
        self.activity = Activity()

    def mark(self, doing: str, env: bool = False) -> None:
        """Record progress: the engine starts ``doing`` now."""
        self.activity = Activity(doing, time.monotonic(), env)

    # ----- sampling --------------------------------------------------------------------------------
    def sampling_params(self, temperature: float | None = None, seed: int = 0) -> SamplingParams:
        """Training sampling from ``rollout.*`` (``temperature`` overrides, e.g. for validation)."""
        return make_sampling_params(self.rollout_cfg, self.stop_token_ids, self.stop_strings, temperature, seed)

    # ----- prompts -----------------------------------------------------------------------------------
    def encode_prompts(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """Chat-templated token ids of user-message texts; also how many were left-truncated."""
        return encode_prompts(self.tokenizer, texts, self.rollout_cfg, self.env_name)

    def prompt_text(self, task_text: str, obs: str, history: History, admissible: list[str]) -> str:
        cfg = self.rollout_cfg
        if not cfg.show_admissible:
            admissible = []
        return build_prompt_text(self.env_name, task_text, obs, history, admissible,
                                 history_length=self.env_cfg.history_length, think=cfg.enable_thinking,
                                 style=cfg.prompt_style, count_repeats=self.env_cfg.history_count_repeats)

    def reset_instances(self, items: Sequence[tuple[int, TaskRef]]) -> list:
        """Reset env instances, a failed one reported in its result (``env.step_timeout_s`` plus
        ``env.reset_timeout_s`` per instance a server resets)."""
        self.mark(f"resetting env instances {id_ranges([i for i, _ in items])}", env=True)
        return self.client.reset(items, timeout=self.env_cfg.step_timeout_s, on_shard_error="report",
                                 per_instance_s=getattr(self.env_cfg, "reset_timeout_s", 0.0))

    def step_instances(self, items: Sequence[tuple[int, str]]) -> list:
        """Apply one action per instance, a failed one reported in its result."""
        self.mark(f"waiting for an env step of instances {id_ranges([i for i, _ in items])}", env=True)
        return self.client.step(items, timeout=self.env_cfg.step_timeout_s, on_shard_error="report")

    def step_reward(self, won_now: bool, won_before: bool, env_reward: float, valid: bool,
                    noop: bool = False) -> StepReward:
        """A step's reward parts: ``env.success_reward`` at the winning step (``env.reward=success``)
        or the env's own reward; ``rollout.invalid_action_penalty`` for a response without a valid
        action; ``rollout.noop_penalty`` for a valid action the environment says changed nothing."""
        if self.env_cfg.reward == "success":
            reward = self.env_cfg.success_reward if (won_now and not won_before) else 0.0
        else:
            reward = float(env_reward)
        if not valid:
            return StepReward(reward, invalid_penalty=float(self.rollout_cfg.invalid_action_penalty))
        return StepReward(reward, noop_penalty=float(self.rollout_cfg.noop_penalty) if noop else 0.0)

    # ----- the loop ----------------------------------------------------------------------------------
    def run(self, tasks: Sequence[TaskRef], group_size: int, *, sampling: SamplingParams | None = None,
            seed: int = 0, group_ids: Sequence[int] | None = None, traj_id_start: int = 0,
            expert_guidance: bool = False) -> RolloutResult:
        """Roll out ``group_size`` episodes of every task; trajectories are numbered from
        ``traj_id_start`` (task by task), groups are ``group_ids`` (default ``0..len(tasks)-1``).

        With ``expert_guidance`` every group whose episodes all failed also gets one episode played
        by the env's expert (:mod:`agentrl.rollout.guidance`): its steps join the batch, not
        ``episodes``."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if not tasks:
            raise ValueError("no tasks to roll out")
        group_ids = list(range(len(tasks))) if group_ids is None else list(group_ids)
        if len(group_ids) != len(tasks):
            raise ValueError(f"{len(group_ids)} group ids for {len(tasks)} tasks")
        sampling = sampling or self.sampling_params(seed=seed)
        groups_per_wave = len(self.instance_ids) // group_size
        if groups_per_wave < 1:
            raise ValueError(f"group size {group_size} needs {group_size} env instances, this engine has "
                             f"{len(self.instance_ids)}")
        results = []
        failures = {"env_failures": 0, "episodes_rerun": 0, "episodes_masked": 0}
        for wave, first in enumerate(range(0, len(tasks), groups_per_wave)):
            chunk = range(first, min(len(tasks), first + groups_per_wave))
            envs = [(tasks[g], group_ids[g], traj_id_start + g * group_size + k)
                    for g in chunk for k in range(group_size)]
            results.extend(self._run_recovering(envs, sampling, seed, wave, failures))
        kept = [r for r in results if r.batch is not None]
        if not kept:
            raise RuntimeError(f"no env step was recorded: every episode failed (last error: "
                               f"{results[-1].episodes[-1].env_error})")
        result = RolloutResult.merge(kept) if len(kept) > 1 else kept[0]
        result.episodes = sorted((e for r in results for e in r.episodes), key=lambda e: e.traj_id)
        if expert_guidance:
            guided, guided_stats = play_guided_episodes(self, all_failed_groups(result.episodes, tasks, group_ids))
            if guided is not None:
                result.batch = StepBatch.concat([result.batch, guided])
            result.stats.update(guided_stats)
        # each group's observations numbered once over all waves and re-runs (StepBatch.anchor_key)
        result.batch = result.batch.with_anchor_keys()
        result.stats.update({k: float(v) for k, v in failures.items()}, episodes=float(len(result.episodes)))
        return result

    def failure_advice(self) -> tuple[str, str]:
        """What to do when too many episodes failed, and what must be healthy before a resume."""
        return "check the env servers, or raise rollout.max_env_failures", "the env servers are healthy"

    def _run_recovering(self, envs: list[tuple[TaskRef, int, int]], sampling: SamplingParams, seed: int,
                        wave: int, failures: dict[str, int]) -> list[RolloutResult]:
        """Run one wave; episodes that an environment failure ended (a raising or hung instance, a
        dead or unreachable shard) are re-run from reset (``rollout.on_env_failure=rerun``, in waves
        of their own, with a growing pause so a restarting shard can come back) or dropped from the
        batch, so their groups' statistics use the survivors (``mask``). Raises
        :class:`EnvFailureLimitError` once more than ``rollout.max_env_failures`` episodes failed in
        this call. Returned parts hold no record of a failed episode (``batch`` None if empty)."""
        mode = getattr(self.rollout_cfg, "on_env_failure", "rerun")
        cap = int(getattr(self.rollout_cfg, "max_env_failures", 16))
        parts, todo, attempt = [], envs, 0
        while todo:
            part = self._run_wave(todo, sampling, seed, wave + RERUN_WAVE_STRIDE * attempt)
            failed = {e.traj_id: e for e in part.episodes if e.env_error is not None}
            failures["env_failures"] += len(failed)
            if failures["env_failures"] > cap:
                first = next(iter(failed.values()))
                advice, resume_when = self.failure_advice()
                raise EnvFailureLimitError(
                    f"{failures['env_failures']} {self.env_name} episodes failed in one rollout, more than "
                    f"rollout.max_env_failures={cap} (last: episode {first.traj_id}: {first.env_error}); {advice}",
                    resume_when)
            if failed and part.batch is not None:
                keep = [t not in failed for t in part.batch.traj_id.tolist()]
                part.batch = part.batch.select(keep) if any(keep) else None
            if mode == "mask" or not failed:
                failures["episodes_masked"] += len(failed)
                parts.append(part)
                break
            part.episodes = [e for e in part.episodes if e.traj_id not in failed]
            parts.append(part)
            failures["episodes_rerun"] += len(failed)
            todo = [env for env in todo if env[2] in failed]
            attempt += 1
            time.sleep(min(RERUN_PAUSE_S * 2 ** (attempt - 1), 5.0))
        return parts

    # ----- episodes ---------------------------------------------------------------------------------
    def start_episodes(self, slots: Sequence[tuple[TaskRef, int, int, int]], tally: Tally) -> list[Episode]:
        """Reset the instance of each ``(task, group_id, traj_id, instance_id)`` and start an episode
        on it (a failed reset gives an episode that is already done, with its error)."""
        t0 = time.perf_counter()
        resets = self.reset_instances([(iid, task) for task, _, _, iid in slots])
        tally.timed("env_s", t0)
        tally.add("env_errors", sum(not r.ok for r in resets))
        return [Episode.started(task, group_id, traj_id, iid, reset, self.record_transcripts)
                for (task, group_id, traj_id, iid), reset in zip(slots, resets)]

    def advance(self, episodes: Sequence[Episode], sampling: SamplingParams, tally: Tally) -> None:
        """One step of every episode in ``episodes`` (none of them done): their prompts, one generate
        call, one batched env step, one record each."""
        t0 = time.perf_counter()
        prompts, truncated = self.encode_prompts([e.prompt_text(self) for e in episodes])
        tally.timed("prompt_s", t0)
        t0 = time.perf_counter()
        if self.before_generate is not None:
            self.before_generate()
        version = self.policy_version     # the weights that generate this step (its first token, at least)
        self.mark(f"generating step {min(e.length for e in episodes)} for {len(prompts)} episodes (env instances "
                  f"{id_ranges([e.instance_id for e in episodes])})")
        generations = self.backend.generate(prompts, sampling)
        tally.timed("generate_s", t0)
        responses = self.tokenizer.batch_decode([g.token_ids for g in generations], skip_special_tokens=True)
        parsed = [parse_response(r, self.env_name, require_think=self.rollout_cfg.enable_thinking) for r in responses]
        t0 = time.perf_counter()
        results = self.step_instances([(e.instance_id, p.action) for e, p in zip(episodes, parsed)])
        tally.timed("env_s", t0)
        for episode, prompt, generation, response, p, result in zip(episodes, prompts, generations, responses,
                                                                     parsed, results):
            noop = episode.take_step(self, prompt, generation, response, p, result,
                                     *step_versions(generation, version))
            tally.add("noop_actions", noop)
        tally.add("env_steps", len(episodes))
        tally.add("generated_tokens", sum(len(g.token_ids) for g in generations))
        tally.add("prompt_tokens", sum(len(p) for p in prompts))
        tally.add("max_prompt_tokens", max(len(p) for p in prompts))
        tally.add("truncated_prompts", truncated)
        tally.add("invalid_actions", sum(not p.valid for p in parsed))
        tally.add("env_errors", sum(not r.ok for r in results))

    def finish_episodes(self, episodes: Sequence[Episode]) -> tuple[StepBatch | None, list[EpisodeResult]]:
        """The finished episodes' records as one batch (trajectory order; None without a record) and
        their results."""
        episodes = sorted(episodes, key=lambda e: e.traj_id)
        results = [e.finish() for e in episodes]
        records = [r for e in episodes for r in e.records]
        return (StepBatch.from_records(records, pad_id=self.pad_id) if records else None), results

    def _run_wave(self, envs: list[tuple[TaskRef, int, int]], sampling: SamplingParams, seed: int,
                  wave: int) -> RolloutResult:
        """The episodes of ``envs`` (task, group id, trajectory id) started together on the first
        instances, advanced together until every one is done."""
        start, tally = time.perf_counter(), Tally()
        slots = [(task, group_id, traj_id, iid) for (task, group_id, traj_id), iid in zip(envs, self.instance_ids)]
        episodes = self.start_episodes(slots, tally)
        active = [e for e in episodes if not e.done]
        step = 0
        while active and step < self.env_cfg.max_steps:
            self.advance(active, sampling.with_seed(step_seed(sampling.seed, wave, step)), tally)
            active = [e for e in active if not e.done]
            step += 1
        batch, results = self.finish_episodes(episodes)
        stats = {**tally.drain(), "episodes": len(envs), "rollout_s": time.perf_counter() - start}
        return RolloutResult(batch, results, stats)


__all__ = ["Activity", "EnvFailureLimitError", "Episode", "EpisodeResult", "PromptTooLongError", "RolloutEngine",
           "RolloutResult", "StepReward", "Tally", "make_sampling_params", "step_seed"]
