"""Expert guidance: the env's own solver plays the tasks whose groups failed in every rollout.

A group whose G sampled episodes all failed gives a critic-free estimator nothing to learn from:
every return is equal, every advantage 0. With ``rollout.expert_guidance`` the rollout engine
adds one more episode to each such group, played by the environment's expert solver
(``expert_actions``, the same solver that writes the SFT demonstrations), so the group has a
winner and a spread of returns (off-policy guidance in the manner of LUFFY, Yan et al. 2025,
without its policy shaping).

The guided episode is recorded exactly like a sampled one: at each step the prompt the policy
would see (same history window, style and truncation), the response the policy would have to
write for the expert's action (``<action>...</action>``, with the SFT demonstrations' thought
when ``enable_thinking``, then the stop token), the env's reward under the same reward rules
and the observation as ``anchor_obs``. So every estimator treats it as one more trajectory of
the group (step-level estimators also compare its steps with the sampled ones at shared states).

What differs from a sampled episode, and why:

* Its hidden state (when the estimator asks for one, ``RowInputs.hidden_layer``) comes from the
  backend's ``prompt_hidden``, a prefill of the guided prompts, when the backend records hidden
  states; otherwise the learner's pass computes it.
* Its rows say ``is_expert`` (the StepBatch column every later stage reads).
* ``rollout_logprobs`` are 0: nothing sampled these tokens. Nothing downstream reads them; the
  learner's log-prob pass scores every row under the current policy (the PPO ratio starts at 1),
  so the clipped update limits how far one iteration moves toward the expert.
* The episode is not in :attr:`RolloutResult.episodes`: success rates and the other episode
  metrics describe the policy's own rollouts. ``stats["guided_episodes"]`` counts them.
* Its trajectory id is ``GUIDED_TRAJ_ID_BASE + group_id`` (unique across rollout workers; nothing
  reads the id to tell an expert row: ``is_expert`` says it).
* An expert that does not win within ``env.max_steps``, whose response for some step would be
  longer than ``rollout.max_response_tokens`` (the policy could not write it), or whose solver
  raised on the env server, adds nothing (``stats["guided_dropped"]``).

Validation and evaluation never use it (``RolloutEngine.run(expert_guidance=False)``, the default).

The estimator gives the group's failed sampled episodes negative advantages (they are below the
new group mean). The trainer puts them back to 0 (:func:`sampled_rows_of_guided_groups`), as they
were without guidance, so only the expert's steps are pushed up: on the tiny TextCraft recipe,
pushing the failures down (mostly degenerate text) doubled the policy's entropy within 10
iterations.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from agentrl.data import StepBatch
from agentrl.envs import TaskRef
from agentrl.envs.server.client import EnvServerError
from agentrl.rollout.parsing import parse_response, shown_action
from agentrl.rollout.prompts import History, format_response
from agentrl.rollout.prompts import task_text as prompt_task_text

GUIDED_TRAJ_ID_BASE = 1_000_000_000


def all_failed_groups(episodes, tasks: Sequence[TaskRef], group_ids: Sequence[int]) -> list[tuple[TaskRef, int]]:
    """(task, group id) of every group with episodes and no win (episodes an env failure ended do
    not count; a group left with none is not guided)."""
    won: dict[int, bool] = {}
    for e in episodes:
        if e.env_error is not None:     # masked (rollout.on_env_failure=mask): not in the batch
            continue
        won[e.group_id] = won.get(e.group_id, False) or bool(e.won)
    return [(task, g) for task, g in zip(tasks, group_ids) if g in won and not won[g]]


def expert_response(env_name: str, action: str, think: bool) -> str:
    """The response a policy writes for ``action`` (the SFT demonstrations' format)."""
    shown = shown_action(action, env_name)
    thought = f"The next step toward the goal is: {shown}." if think else None
    return format_response(shown, thought)


def play_guided_episodes(engine, groups: Sequence[tuple[TaskRef, int]], instance_ids: Sequence[int] | None = None
                         ) -> tuple[StepBatch | None, dict[str, float]]:
    """Step records of the expert's episode for each ``(task, group_id)``, played on ``instance_ids``
    (default: all the engine's env instances; waves of as many as there are), and counters."""
    records: list[dict[str, Any]] = []
    stats = {"guided_groups": float(len(groups)), "guided_episodes": 0.0, "guided_steps": 0.0,
             "guided_dropped": 0.0}
    ids = list(engine.instance_ids if instance_ids is None else instance_ids)
    for first in range(0, len(groups), len(ids)):
        wave_records, wave_stats = _play_wave(engine, list(groups[first:first + len(ids)]), ids)
        records.extend(wave_records)
        for key, value in wave_stats.items():
            stats[key] += value
    if not records:
        return None, stats
    return StepBatch.from_records(records, pad_id=engine.pad_id), stats


def _play_wave(engine, groups: list[tuple[TaskRef, int]], instance_ids: Sequence[int]
               ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    cfg, env_cfg = engine.rollout_cfg, engine.env_cfg
    ids = list(instance_ids[:len(groups)])
    resets = engine.reset_instances([(iid, task) for iid, (task, _) in zip(ids, groups)])
    live = [i for i, r in enumerate(resets) if r.ok]
    try:
        plans = dict(zip(live, engine.client.expert_actions([ids[i] for i in live],
                                                            timeout=env_cfg.step_timeout_s)))
    except EnvServerError:      # guidance is extra data: a failing solver drops the wave, not the run
        live, plans = [], {}
    stop = engine.stop_token_ids[0]
    obs = {i: resets[i].obs for i in live}
    anchors = dict(obs)
    info = {i: resets[i].info for i in live}
    history = {i: History() for i in live}
    won = dict.fromkeys(live, False)
    total = dict.fromkeys(live, 0.0)
    usable = dict.fromkeys(live, True)
    episode: dict[int, list[dict[str, Any]]] = {i: [] for i in live}
    active = [i for i in live if plans[i]]
    step = 0
    while active and step < env_cfg.max_steps:
        texts = [engine.prompt_text(prompt_task_text(engine.env_name, resets[i].obs, resets[i].info, info[i]),
                                    obs[i], history[i], info[i].get("admissible_actions") or []) for i in active]
        prompts, _ = engine.encode_prompts(texts)
        hidden = engine.backend.prompt_hidden(prompts)     # None unless the backend records states
        responses = [expert_response(engine.env_name, plans[i][step], cfg.enable_thinking) for i in active]
        parsed = [parse_response(r, engine.env_name, require_think=cfg.enable_thinking) for r in responses]
        results = engine.step_instances([(ids[i], p.action) for i, p in zip(active, parsed)])
        still_active = []
        for j, (i, prompt, response, p, res) in enumerate(zip(active, prompts, responses, parsed, results)):
            tokens = engine.tokenizer(response, add_special_tokens=False)["input_ids"] + [stop]
            usable[i] = usable[i] and res.ok and len(tokens) <= cfg.max_response_tokens
            won_now = bool(res.info.get("won", False))
            reward = engine.step_reward(won_now, won[i], res.reward, p.valid, bool(res.info.get("noop")))
            total[i] += reward.total
            done = res.done or not res.ok or step + 1 >= env_cfg.max_steps or step + 1 >= len(plans[i])
            group_id = groups[i][1]
            episode[i].append({
                "group_id": group_id, "traj_id": GUIDED_TRAJ_ID_BASE + group_id, "step": step,
                "prompt_ids": prompt, "response_ids": tokens, "response_mask": [1.0] * len(tokens),
                "rollout_logprobs": [0.0] * len(tokens), **reward.columns(), "done": done,
                "anchor_obs": anchors[i], "action": p.action if p.valid else "", "action_valid": p.valid,
                "task_type": str(info[i].get("task_type", "")), "is_expert": True,
                "policy_version": engine.policy_version,
                "hidden": hidden[j] if hidden is not None else None,
            })
            won[i] = won[i] or won_now
            history[i].add(obs[i], p.action)
            obs[i], info[i] = res.obs, res.info
            anchors[i] = res.obs
            if not done:
                still_active.append(i)
        active = still_active
        step += 1
    records: list[dict[str, Any]] = []
    kept = 0
    for i in live:
        if not (won[i] and usable[i]):
            continue
        for r in episode[i]:
            r["success"], r["episode_return"] = True, total[i]
        records.extend(episode[i])
        kept += 1
    return records, {"guided_episodes": float(kept), "guided_steps": float(len(records)),
                     "guided_dropped": float(len(groups) - kept)}


def sampled_rows_of_guided_groups(batch: StepBatch) -> torch.Tensor:
    """Bool mask of the sampled (not expert) rows in groups that got an expert episode."""
    guided = batch.is_expert
    if not bool(guided.any()):
        return torch.zeros(len(batch), dtype=torch.bool)
    return torch.isin(batch.group_id, batch.group_id[guided].unique()) & ~guided


__all__ = ["GUIDED_TRAJ_ID_BASE", "all_failed_groups", "expert_response", "play_guided_episodes",
           "sampled_rows_of_guided_groups"]
