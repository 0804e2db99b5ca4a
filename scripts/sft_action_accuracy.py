"""Which decisions a warm start gets right: greedy next-action accuracy on expert demonstrations.

Success rate says whether a policy wins; this says which step it loses on. Every step of the
expert's episodes on ``--split`` is rendered with the run's own prompt settings (as SFT and the
rollout render it), the policy answers greedily, and its action is compared with the expert's.
Accuracy is reported per action kind (the action's first word: ``go``, ``open``, ``take``,
``move``, ``craft``, ...), per kind after the expert's previous kind (``go after take`` is
ALFWorld's turn from searching to carrying) and overall, as one JSON object.

    python scripts/sft_action_accuracy.py checkpoint=runs/alfworld_grpo_tiny-seed0/sft_model \
        split=valid_seen tasks=32 [recipe=NAME] [key=value ...]

The configuration is found as ``agentrl eval`` finds it (the run's config.yaml, or recipe=NAME);
``key=value`` overrides it.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from agentrl.cli.commands.eval import _config
from agentrl.evaluation.runner import resolve_policy
from agentrl.models import load_tokenizer, stop_token_ids
from agentrl.generation import make_backend
from agentrl.rollout.engine import encode_prompts, make_sampling_params
from agentrl.rollout.parsing import parse_response
from agentrl.runs.task_schedule import TaskSchedule
from agentrl.warmstart.demonstrations import (demonstration_action, demonstration_env_kwargs, expert_episodes,
                                              repeat_key)

OPTIONS = ("checkpoint", "split", "tasks", "batch")


def greedy_actions(cfg, model_dir: str, prompts: list[str], batch: int) -> list[str]:
    """The policy's greedy action for each user-message text, generated as the rollout generates
    (same backend, prompt encoding and truncation, stop tokens and response limit) at temperature 0."""
    tokenizer = load_tokenizer(model_dir)
    backend = make_backend("torch", model_dir)
    sampling = make_sampling_params(cfg.rollout, stop_token_ids(tokenizer), temperature=0.0)
    actions = []
    for start in range(0, len(prompts), batch):
        ids, _ = encode_prompts(tokenizer, prompts[start:start + batch], cfg.rollout, cfg.env.name)
        texts = tokenizer.batch_decode([g.token_ids for g in backend.generate(ids, sampling)], skip_special_tokens=True)
        actions += [parse_response(t, cfg.env.name, require_think=cfg.rollout.enable_thinking).action for t in texts]
    return actions


def main(argv: list[str]) -> int:
    options = dict(a.split("=", 1) for a in argv if "=" in a and a.split("=", 1)[0] in OPTIONS)
    rest = [a for a in argv if a.split("=", 1)[0] not in OPTIONS]
    if "checkpoint" not in options:
        print(__doc__, file=sys.stderr)
        return 2
    policy = resolve_policy(Path(options["checkpoint"]), lambda text: None)
    cfg = _config({}, rest, policy.run_dir)
    split = options.get("split") or cfg.env.eval_split
    tasks = min(int(options.get("tasks", 32)), TaskSchedule.checked_split_size(cfg.env, split, "split"))
    demos = list(expert_episodes(cfg.env.name, demonstration_env_kwargs(cfg), split, range(tasks),
                                 history_length=cfg.env.history_length, think=cfg.rollout.enable_thinking,
                                 style=cfg.rollout.prompt_style, show_admissible=cfg.rollout.show_admissible,
                                 count_repeats=cfg.env.history_count_repeats,
                                 workers=cfg.trainer.sft.demonstration_workers))
    got = greedy_actions(cfg, str(policy.model_dir), [d.prompt for d in demos], int(options.get("batch", 32)))
    counts = collections.defaultdict(lambda: [0, 0])
    for demo, action in zip(demos, got):
        want = demonstration_action(demo, cfg.env.name)
        kind, after = repeat_key(demo, cfg.env.name)
        for key in (kind, "all") + ((after,) if after else ()):
            counts[key][0] += int(action == want)
            counts[key][1] += 1
    print(json.dumps({"policy": str(policy.model_dir), "split": split, "episodes": tasks,
                      "accuracy": {k: {"right": r, "steps": n, "rate": round(r / n, 3)}
                                   for k, (r, n) in sorted(counts.items())}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
