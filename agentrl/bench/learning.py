"""``agentrl bench learning``: does RL add success over the SFT warm start of the tiny recipes?

For each recipe and seed this runs the real trainer (``agentrl train recipe=R trainer.seed=S``,
one run at a time), then reads the run's ``metrics.jsonl``: validation success before RL (the
warm start, iteration 0) and after the last iteration, the RL iterations done, the mean iteration
time split into its parts, the SFT minutes and the run's wall time. It prints each run's summary as
a JSON line when the run ends, then a Markdown table (per run, then the mean over seeds of each
recipe), and writes them to ``--out`` (``results.json``, ``table.md``, each run's log). With
``--json`` the summaries go to stderr and stdout gets one JSON object at the end. The exit status
is 1 when a run failed.

    agentrl bench learning --recipes textcraft_grpo_tiny --seeds 0,1,2 --out /tmp/bench_learning
    # several RL seeds from one warm start (SFT once; its score is then the same for every seed):
    agentrl bench learning --recipes textcraft_grpo_tiny --seeds 0,1,2 --share-sft
    # estimator overhead on the same warm start and tasks:
    agentrl bench learning --recipes textcraft_gigpo_tiny,textcraft_bipace_tiny --seeds 0 \\
        --init-checkpoint /tmp/bench_learning/.../sft_model trainer.iterations=6 trainer.eval_every=0

Extra ``key=value`` arguments are passed to every run as config overrides.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentrl.bench._common import cpu_name
from agentrl.runs.tracking import read_metrics
from agentrl.runtime.child_env import child_environment

HELP = "tiny recipes trained for real, per recipe and seed: validation success after SFT and after RL, time"
TIME_KEYS = ("time/iteration_s", "time/rollout_s", "time/learner_pass_s", "time/estimate_s", "time/update_s")


def add_arguments(parser) -> None:
    parser.add_argument("--recipes", default="textcraft_grpo_tiny", help="comma-separated recipe names")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated trainer seeds")
    parser.add_argument("--out", default="/tmp/bench_learning", help="output directory (runs, logs, results.json)")
    parser.add_argument("--share-sft", action="store_true",
                        help="warm-start every later seed of a recipe from the first seed's SFT model")
    parser.add_argument("--init-checkpoint", default=None, help="start every run from this model directory")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run")


def summarize_run(run_dir: Path) -> dict:
    rows = read_metrics(run_dir / "metrics.jsonl")
    vals = [(r["step"], r["val/success_rate"]) for r in rows if "val/success_rate" in r]
    iters = [r for r in rows if "time/iteration_s" in r]
    sft = next((r for r in rows if "sft/summary/minutes" in r), {})
    out = {
        "run_dir": str(run_dir),
        "val_start": next((v for s, v in vals if s == 0), None),
        "val_end": vals[-1][1] if vals and vals[-1][0] > 0 else None,
        "val_curve": vals,
        "iterations": len(iters),
        "sft_minutes": sft.get("sft/summary/minutes"),
        "sft_steps": sft.get("sft/summary/steps"),
        "rollout_success_first": iters[0]["rollout/success_rate"] if iters else None,
        "rollout_success_last": iters[-1]["rollout/success_rate"] if iters else None,
        "mixed_groups_mean": statistics.mean(r["rollout/mixed_outcome_groups"] for r in iters) if iters else None,
    }
    for key in TIME_KEYS:
        values = [r[key] for r in iters if key in r]
        out[key.split("/")[1] + "_mean"] = statistics.mean(values) if values else None
    val_times = [r["time/validation_s"] for r in rows if "time/validation_s" in r]
    out["validation_s_total"] = sum(val_times)
    return out


def run_one(recipe: str, seed: int, out: Path, overrides: list[str], init_checkpoint: str | None) -> dict:
    name = f"{recipe}-seed{seed}"
    cmd = [sys.executable, "-m", "agentrl.cli.main", "train", f"recipe={recipe}", f"trainer.seed={seed}",
           f"trainer.output_dir={out}", f"trainer.run_name={name}", "logging.progress_bar=false",
           "logging.wandb.mode=disabled", *overrides]
    if init_checkpoint:
        cmd.append(f"trainer.init_checkpoint={init_checkpoint}")
    env = child_environment()     # a run of its own: not the rendezvous of a learner in this process
    load_before = os.getloadavg()
    start = time.time()
    log_path = out / f"{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    wall = time.time() - start
    result = {"recipe": recipe, "seed": seed, "returncode": proc.returncode, "wall_s": wall,
              "load_before": load_before, "load_after": os.getloadavg(), "log": str(log_path),
              "init_checkpoint": init_checkpoint}
    run_dir = out / name
    if (run_dir / "metrics.jsonl").exists():
        result.update(summarize_run(run_dir))
    return result


def fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def table(results: list[dict]) -> str:
    lines = ["| recipe | seed | val success after SFT | after RL | gain | iterations | s / iteration "
             "(rollout, learner pass, update) | SFT min | wall min | load (1-min avg, before/after) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        gain = None if r.get("val_start") is None or r.get("val_end") is None else r["val_end"] - r["val_start"]
        lines.append(
            f"| {r['recipe']} | {r['seed']} | {fmt(r.get('val_start'))} | {fmt(r.get('val_end'))} | "
            f"{fmt(gain, '+.3f')} | {r.get('iterations', 0)} | {fmt(r.get('iteration_s_mean'), '.1f')} "
            f"({fmt(r.get('rollout_s_mean'), '.1f')}, {fmt(r.get('learner_pass_s_mean'), '.2f')}, "
            f"{fmt(r.get('update_s_mean'), '.1f')}) | {fmt(r.get('sft_minutes'), '.1f')} | {r['wall_s'] / 60:.1f} | "
            f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |")
    by_recipe: dict[str, list[dict]] = {}
    for r in results:
        by_recipe.setdefault(r["recipe"], []).append(r)
    lines += ["", "| recipe | seeds | mean after SFT | mean after RL | mean gain | mean s / iteration | mean wall min |",
              "|---|---|---|---|---|---|---|"]
    for recipe, rs in by_recipe.items():
        ok = [r for r in rs if r.get("val_start") is not None and r.get("val_end") is not None]
        mean = (lambda k: statistics.mean(r[k] for r in ok) if ok else None)
        its = [r["iteration_s_mean"] for r in rs if r.get("iteration_s_mean") is not None]
        lines.append(f"| {recipe} | {len(ok)} | {fmt(mean('val_start'))} | {fmt(mean('val_end'))} | "
                     f"{fmt(None if not ok else mean('val_end') - mean('val_start'), '+.3f')} | "
                     f"{fmt(statistics.mean(its) if its else None, '.1f')} | "
                     f"{statistics.mean(r['wall_s'] for r in rs) / 60:.1f} |")
    return "\n".join(lines)


def run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = sys.stderr if args.json else sys.stdout
    results: list[dict[str, Any]] = []
    for recipe in args.recipes.split(","):
        init = args.init_checkpoint
        for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
            result = run_one(recipe, seed, out, args.overrides, init)
            results.append(result)
            print(json.dumps(result), file=progress, flush=True)
            if args.share_sft and i == 0 and init is None:
                sft_dir = out / f"{recipe}-seed{seed}" / "sft_model"
                init = str(sft_dir) if sft_dir.is_dir() else None
            (out / "results.json").write_text(json.dumps(results, indent=2))
    report = table(results)
    (out / "table.md").write_text(report + "\n")
    if args.json:
        meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "out": str(out), "overrides": list(args.overrides)}
        print(json.dumps({"meta": meta, "results": results}, indent=2))
    else:
        print(report)
    return 0 if all(r["returncode"] == 0 for r in results) else 1
