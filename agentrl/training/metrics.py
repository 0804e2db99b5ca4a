"""The numbers one iteration logs besides the learner's and the estimator's own: what the rollout
did (episodes, steps, tokens, failures, where its time went) and how far the learner's log-probs are
from the rollout backend's."""

from __future__ import annotations

import sys

from agentrl.rollout.validation import summarize


def episode_metrics(result, prefix: str = "rollout/") -> dict[str, float]:
    summary = summarize(result.episodes)
    metrics = summary.metrics(prefix)
    batch = result.batch
    metrics[f"{prefix}step_records"] = float(len(batch))
    metrics[f"{prefix}env_steps"] = float((~batch.is_expert).sum())     # sampled steps (expert-guided ones left out)
    metrics[f"{prefix}response_tokens"] = float(batch.response_mask.sum())
    metrics[f"{prefix}mixed_outcome_groups"] = mixed_outcome_groups(result.episodes)
    for key in ("env_failures", "episodes_rerun", "episodes_masked", "guided_episodes", "generated_tokens",
                "truncated_prompts", "dropped_system_messages", "noop_actions"):
        metrics[f"{prefix}{key}"] = float(result.stats.get(key, 0.0))
    # several env servers (env.server_url): per server, instances it failed and moved off it, and
    # whether it is down (env/server<i>_failed, _moved, _down; docs/env-servers.md)
    for key, value in result.stats.items():
        if key.startswith(("env_server", "max_env_server")):
            metrics["env/" + key.removeprefix("max_").removeprefix("env_")] = float(value)
    # valid actions the environment answered with "nothing changed" (ALFWorld's "Nothing happens.")
    metrics[f"{prefix}noop_rate"] = metrics[f"{prefix}noop_actions"] / max(1.0, float(result.stats.get("env_steps", 0)))
    # where the rollout's time went (seconds summed over the rollout workers, which run in parallel)
    for key in ("generate_s", "env_s", "prompt_s"):
        metrics[f"time/rollout_{key}"] = float(result.stats.get(key, 0.0))
    # how long the rollout workers had been idle before these calls (summed over workers): in sync
    # mode while the learner worked; with one_step_off while they waited for the next call
    metrics["time/rollout_wait_s"] = float(result.stats.get("idle_before_s", 0.0))
    return metrics


class PromptCutWarning:
    """One warning per run (on the driver, whatever the number of rollout workers) the first time the
    rollout cut prompts to ``rollout.max_prompt_tokens`` (``rollout/truncated_prompts``), saying also
    how many lost their system message, the instructions and tools an outside agent sent
    (``rollout/dropped_system_messages``): a model that never sees its tools cannot learn to use them."""

    def __init__(self) -> None:
        self.warned = False

    def check(self, metrics: dict[str, float], iteration: int, max_prompt_tokens: int) -> None:
        cut = int(metrics.get("rollout/truncated_prompts", 0))
        if self.warned or cut == 0:
            return
        self.warned = True
        dropped = int(metrics.get("rollout/dropped_system_messages", 0))
        lost = (f"; {dropped} of them lost their system message (instructions, tools), which takes more than half "
                "of that (rollout/dropped_system_messages)") if dropped else ""
        print(f"agentrl: warning: {cut} prompts of iteration {iteration} were longer than rollout.max_prompt_tokens="
              f"{max_prompt_tokens} and kept only their last tokens (rollout/truncated_prompts){lost}; raise "
              "rollout.max_prompt_tokens or send shorter prompts (this warning is shown once per run)",
              file=sys.stderr, flush=True)


def mixed_outcome_groups(episodes) -> float:
    """Groups with both a won and a lost episode."""
    by_group: dict[int, set[bool]] = {}
    for e in episodes:
        by_group.setdefault(e.group_id, set()).add(bool(e.won))
    return float(sum(len(v) == 2 for v in by_group.values()))


def rollout_logprob_gap(batch) -> dict[str, float]:
    """How far the learner's log-probs of the sampled tokens (``old_logprobs``, before the update)
    are from the ones the rollout backend reported: mean and max absolute difference over the
    sampled response tokens. Near 0 when the backend runs the learner's weights in the same
    precision and version; bf16 generation (vLLM, the torch backend on GPU) shows as a small gap,
    a weight sync that did not arrive, or a stale group, as a large one. Expert-guided rows are left
    out: nothing sampled their tokens, so their rollout log-probs are 0."""
    if len(batch) == 0 or batch.old_logprobs is None:
        return {}
    sampled = ~batch.is_expert.unsqueeze(1) & (batch.response_mask > 0)
    if not bool(sampled.any()):
        return {}
    gap = (batch.old_logprobs.float() - batch.rollout_logprobs.float()).abs()[sampled]
    return {"learner/rollout_logprob_gap_mean": float(gap.mean()), "learner/rollout_logprob_gap_max": float(gap.max())}


__all__ = ["episode_metrics", "mixed_outcome_groups", "rollout_logprob_gap"]
