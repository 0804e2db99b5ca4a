"""``agentrl eval checkpoint=PATH [env=NAME] [split=NAME] [seeds=0,1,2] [out=DIR] [key=value ...]``."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.cli.commands._common import require_agent
from agentrl.errors import UsageError

HELP = "evaluate a policy on a whole split: one JSONL line per episode and a summary (resumable)"
TORCH_COMPUTE = True    # see agentrl.cli.main
DESCRIPTION = ("Play every task of split=NAME (default: the run's env.eval_split) once per seed with the rollout "
               "workers. checkpoint=PATH is a Hugging Face model directory (final_model, sft_model, an export) or "
               "a run directory (its final_model, else its newest checkpoint). Writes out=DIR/episodes.jsonl "
               "(task, type, success, reward, score, steps, transcript) and out=DIR/summary.json (default "
               "DIR: <run>/eval/<env>_<split>). A re-run skips the episodes already in the JSONL. The "
               "configuration is the run's config.yaml, or recipe=NAME, or the environment's paper settings.")

OPTIONS = ("checkpoint", "env", "split", "seeds", "out")


def add_arguments(parser) -> None:
    parser.add_argument("args", nargs="*", metavar="checkpoint=PATH|env=NAME|split=NAME|seeds=S,...|key=value",
                        help="checkpoint=PATH (required), env=, split=, seeds= (comma separated), out=DIR, "
                             "recipe=NAME, then config overrides (e.g. eval.temperature=0 eval.num_tasks=50)")


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.replace("[", "").replace("]", "").split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"seeds={text!r}: expected comma-separated integers, e.g. seeds=0,1,2") from None
    if not seeds:
        raise UsageError("seeds= is empty")
    return seeds


def _config(options: dict[str, str], rest: list[str], run_dir: Path | None):
    from agentrl.config import load_config, parse_overrides
    from agentrl.envs.spec import env_spec

    recipe, overrides = parse_overrides(rest)
    env = options.get("env")
    if recipe is None and run_dir is not None:
        recipe = str(run_dir / "config.yaml")
    if recipe is None:
        if env is None:
            raise UsageError("this checkpoint has no run configuration: pass env=NAME (and recipe=NAME for a tiny "
                             "model)")
        declared = env_spec(env)        # an unknown environment: one line naming the ones found
        block = Path(declared.recipes_dir or ".") / "_base" / "env" / f"{env}.yaml"
        recipe = str(block) if declared.recipes_dir and block.is_file() else None
        overrides = [f"env.name={env}", *overrides]
    cfg = load_config(recipe, overrides, training=False)     # rollout.agent: no training-only refusals
    if env is not None and env != cfg.env.name:
        raise UsageError(f"env={env} but the configuration ({Path(recipe).name}) is for {cfg.env.name}; "
                         f"pass recipe=NAME of a {env} recipe")
    return cfg


def run(args) -> int:
    options = dict(a.split("=", 1) for a in args.args if "=" in a and a.split("=", 1)[0] in OPTIONS)
    rest = [a for a in args.args if a.split("=", 1)[0] not in OPTIONS]
    if "checkpoint" not in options:
        raise UsageError("eval needs checkpoint=PATH (a model directory or a run directory)")
    from agentrl.evaluation.runner import default_output_dir, evaluate, resolve_policy, summary_line

    log = lambda text: print(f"[eval] {text}", flush=True)  # noqa: E731
    policy = resolve_policy(Path(options["checkpoint"]), log)
    cfg = _config(options, rest, policy.run_dir)
    require_agent(cfg)
    split = options.get("split") or cfg.eval.split or cfg.env.eval_split
    seeds = parse_seeds(options["seeds"]) if "seeds" in options else [int(s) for s in cfg.eval.seeds]
    out = Path(options["out"]).expanduser() if "out" in options else default_output_dir(policy, cfg.env.name, split)
    log(f"policy {policy.model_dir} ({policy.source}) -> {out}")
    summary = evaluate(cfg, policy.model_dir, out, split=split, seeds=seeds, log=log,
                       meta={"policy": policy.source, "run_dir": str(policy.run_dir) if policy.run_dir else None})
    from agentrl.evaluation.plots import plot_task_types

    chart = plot_task_types(summary, out / "success_by_type.png")
    print(summary_line(summary))
    print(json.dumps({"episodes": str(out / "episodes.jsonl"), "summary": str(out / "summary.json"),
                      "chart": str(chart)}))
    return 0
