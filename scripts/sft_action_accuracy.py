"""Which decisions a warm start gets right: greedy next-action accuracy on expert demonstrations.

Success rate says whether a policy wins; this says which step it loses on. Every step of the
expert's episodes on ``--split`` is rendered with the run's own prompt settings (as SFT and the
rollout render it), the policy answers greedily, and its action is compared with the expert's.
Accuracy is reported per action kind (the action's first word: ``go``, ``open``, ``take``,
``move``, ``craft``, ...) and overall, as one JSON object.

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

import torch

from agentrl.cli.commands.eval import _config
from agentrl.data.demonstrations import demonstration_env_kwargs, expert_episodes
from agentrl.evaluation.runner import resolve_policy
from agentrl.models import load_model, load_tokenizer
from agentrl.rollout.parsing import parse_response
from agentrl.rollout.prompts import render_chat

OPTIONS = ("checkpoint", "split", "tasks", "batch")


def action_kind(action: str) -> str:
    return action.split()[0] if action.split() else "(empty)"


def greedy_actions(model, tokenizer, prompts: list[str], max_prompt_tokens: int, max_new_tokens: int,
                   env_name: str, batch: int) -> list[str]:
    actions = []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for start in range(0, len(prompts), batch):
        rows = [tokenizer(render_chat(tokenizer, p), add_special_tokens=False)["input_ids"][-max_prompt_tokens:]
                for p in prompts[start:start + batch]]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])        # left padding
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=pad)
        for row in out[:, width:]:
            actions.append(parse_response(tokenizer.decode(row, skip_special_tokens=True), env_name).action)
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
    tasks = int(options.get("tasks", 32))
    demos = list(expert_episodes(cfg.env.name, demonstration_env_kwargs(cfg), split, range(tasks),
                                 history_length=cfg.env.history_length, think=cfg.rollout.enable_thinking,
                                 style=cfg.rollout.prompt_style, show_admissible=cfg.rollout.show_admissible,
                                 count_repeats=cfg.env.history_count_repeats,
                                 workers=cfg.trainer.sft.demonstration_workers))
    torch.manual_seed(0)
    tokenizer, model = load_tokenizer(policy.model_dir), load_model(policy.model_dir, dtype=torch.float32).eval()
    got = greedy_actions(model, tokenizer, [d.prompt for d in demos], cfg.rollout.max_prompt_tokens,
                         cfg.rollout.max_response_tokens, cfg.env.name, int(options.get("batch", 32)))
    counts = collections.defaultdict(lambda: [0, 0])
    for demo, action in zip(demos, got):
        want = parse_response(demo.response, cfg.env.name).action
        for key in (action_kind(want), "all"):
            counts[key][0] += int(action == want)
            counts[key][1] += 1
    print(json.dumps({"policy": str(policy.model_dir), "split": split, "episodes": tasks,
                      "accuracy": {k: {"right": r, "steps": n, "rate": round(r / n, 3)}
                                   for k, (r, n) in sorted(counts.items())}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
