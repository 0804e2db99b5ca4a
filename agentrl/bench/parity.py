"""``agentrl bench parity``: does an overlapped mode learn like ``sync``, at equal iterations and at
equal wall-clock time, on the same held-out layouts?

For every seed, ``sync`` and the compared mode train the same recipe from the seed's warm start
(one SFT cache for both), each in an ``agentrl train`` process of its own, one after the other:
``sync`` for ``--iterations`` iterations, the compared mode for ``--compared-iterations`` (more, as it
runs more iterations in the same time), both validating every ``--eval-every`` iterations on the same
layouts with the same sampling seeds. Every validation episode is kept per layout
(``<run>/validation/iter_N.jsonl``), so the comparison is paired:

* **equal iterations**: both runs at iteration ``--iterations``;
* **equal wall-clock time**: ``sync`` at ``--iterations`` against the compared run's last validation
  whose training time is no more than ``sync``'s (training time: the wall time of the iterations,
  validation left out, which pauses both modes alike).

Per seed: the success of each run and the mean over layouts of the paired difference (compared
minus sync, each layout 1, 0 or -1) with its 95 % interval over layouts; over seeds: the mean of
the per-seed differences with a 95 % t-interval over seeds, and one interval over every (seed,
layout) pair pooled. Parity means the interval holds 0. Each run's gain over its warm start (its
last validation against its iteration 0, paired per layout) is reported the same way.

The compared side can be ``sync`` with overrides of its own, which makes this the paired A/B of
any two settings from one warm start per seed (a policy loss, an estimator):

    agentrl bench parity --seeds 0,1,2,3,4 --out /tmp/parity
    agentrl bench parity --compared "async+trainer.max_staleness=1" --compared-iterations 24
    agentrl bench parity --compared "sync+rollout.agent=agentrl.agents.textcraft_openai:run_episode" \
        --compared-name gateway --compared-iterations 16 rollout.expert_guidance=false
    agentrl bench parity --seeds 0,1,2 --iterations 16 --compared-iterations 16 --eval-every 8 \
        --compared "sync+learner.policy_loss=cispo" --compared-name cispo
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agentrl.bench._common import cpu_name, run_report
from agentrl.runs.tracking import read_metrics
from agentrl.runtime.child_env import child_environment

HELP = ("sync vs an overlapped trainer.mode (or any variant: sync+overrides): validation success at equal iterations "
        "and equal time, and each run's gain over its warm start, paired per layout")

# two-sided 95 % t quantiles by degrees of freedom (scipy is not a dependency)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}


def add_arguments(parser) -> None:
    parser.add_argument("--recipe", default="textcraft_grpo_tiny", help="the recipe both modes train (default %(default)s)")
    parser.add_argument("--compared", default="async", help="the mode compared with sync, with +key=value overrides "
                                                            "of its own (default %(default)s)")
    parser.add_argument("--compared-name", default="", help="the compared runs' name (default: the mode); needed "
                                                                "when the compared mode is sync with overrides")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated trainer seeds (default %(default)s)")
    parser.add_argument("--iterations", type=int, default=16, help="sync's iterations (default %(default)s)")
    parser.add_argument("--compared-iterations", type=int, default=24,
                        help="the compared mode's iterations (default %(default)s)")
    parser.add_argument("--eval-every", type=int, default=4, help="validation interval of both (default %(default)s)")
    parser.add_argument("--share-sft", action="store_true",
                        help="start every later seed's runs from the first seed's SFT model (its sync run's)")
    parser.add_argument("--out", default="/tmp/agentrl-bench-parity", help="runs, SFT cache and results")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run")


def t95(dof: int) -> float:
    if dof <= 0:
        return math.nan
    return T95[max(k for k in T95 if k <= dof)]


def mean_interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval (nan for fewer than two values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def train(args, name: str, mode: str, iterations: int, seed: int, extra: list[str]) -> Path:
    out = Path(args.out)
    run_dir = out / "runs" / name
    if (run_dir / "final_model").is_dir():     # finished before (a rerun of the bench continues it)
        return run_dir
    cmd = [sys.executable, "-m", "agentrl.cli.main", "train", f"recipe={args.recipe}", f"trainer.mode={mode}",
           f"trainer.seed={seed}", f"trainer.iterations={iterations}", f"trainer.eval_every={args.eval_every}",
           "trainer.eval_before_train=true", "trainer.save_every=0", f"trainer.output_dir={out / 'runs'}",
           f"trainer.run_name={name}", f"trainer.sft.cache_dir={out / 'sft_cache'}", "logging.wandb.mode=disabled",
           "logging.tensorboard=false", "logging.progress_bar=false", *args.overrides, *extra]
    with open(out / f"{name}.log", "w") as log:
        done = subprocess.run(cmd, env=child_environment(), stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"agentrl train ({name}) failed: see {out / f'{name}.log'}")
    return run_dir


def training_seconds(run_dir: Path) -> dict[int, float]:
    """Iteration -> the run's training time up to its end: wall time since iteration 0's validation
    ended, less the validations in between."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    start = next(r["time"] for r in rows if r.get("step") == 0 and "val/success_rate" in r)
    validation = {r["step"]: r["time/validation_s"] for r in rows if "time/validation_s" in r and r["step"] > 0}
    out = {}
    for r in sorted((r for r in rows if "time/iteration_s" in r), key=lambda r: r["step"]):
        out[r["step"]] = r["time"] - start - sum(v for k, v in validation.items() if k < r["step"])
    return out


def outcomes(run_dir: Path, iteration: int) -> dict[tuple, bool]:
    """(sampling seed, split, task index) -> won, for the validation of ``iteration``."""
    lines = (run_dir / "validation" / f"iter_{iteration:06d}.jsonl").read_text().splitlines()
    episodes = [json.loads(line) for line in lines if line]
    return {(e["seed"], e["task"]["split"], e["task"]["index"]): bool(e["won"]) for e in episodes}


def paired(sync: dict[tuple, bool], compared: dict[tuple, bool]) -> dict[str, float]:
    keys = sorted(set(sync) & set(compared))
    diffs = [float(compared[k]) - float(sync[k]) for k in keys]
    mean, half = mean_interval(diffs)
    return {"sync": statistics.fmean(float(sync[k]) for k in keys),
            "compared": statistics.fmean(float(compared[k]) for k in keys),
            "diff": mean, "diff_95": half, "layouts": len(keys),
            "only_compared_won": sum(d > 0 for d in diffs), "only_sync_won": sum(d < 0 for d in diffs)}


def measure(args) -> dict:
    mode, *own = args.compared.split("+")
    name = getattr(args, "compared_name", "") or mode
    if name == "sync":
        raise SystemExit("agentrl bench parity: the compared runs would share sync's run directories; "
                         "name them with --compared-name (e.g. --compared-name gateway)")
    started = time.time()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    per_seed, start = [], []
    pooled: dict[str, tuple[dict, dict]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        sync_dir = train(args, f"sync-seed{seed}", "sync", args.iterations, seed, start)
        other_dir = train(args, f"{name}-seed{seed}", mode, args.compared_iterations, seed, [*start, *own])
        if getattr(args, "share_sft", False) and not start and (sync_dir / "sft_model").is_dir():
            start = [f"trainer.init_checkpoint={sync_dir / 'sft_model'}"]
        sync_time, other_time = training_seconds(sync_dir), training_seconds(other_dir)
        evaluated = sorted(int(p.stem.split("_")[1]) for p in (other_dir / "validation").glob("iter_*.jsonl"))
        budget = sync_time[args.iterations]
        at_time = max((k for k in evaluated if k > 0 and other_time[k] <= budget), default=evaluated[0])
        sync_final, other_final = outcomes(sync_dir, args.iterations), outcomes(other_dir, args.iterations)
        sync_start, other_start = outcomes(sync_dir, 0), outcomes(other_dir, 0)
        pairs = {"equal_iterations": (sync_final, other_final), "sync_gain": (sync_start, sync_final),
                 "compared_gain": (other_start, other_final)}
        for key, (before, after) in pairs.items():      # pooled: (seed, layout) -> won, over every seed
            pooled_before, pooled_after = pooled.setdefault(key, ({}, {}))
            pooled_before.update({(seed, *k): v for k, v in before.items()})
            pooled_after.update({(seed, *k): v for k, v in after.items()})
        row = {"seed": seed, "warm_start": statistics.fmean(sync_start.values()),
               "sync_training_s": budget, "compared_training_s_at_equal_iterations": other_time[args.iterations],
               **{key: paired(before, after) for key, (before, after) in pairs.items()},
               "equal_time_iteration": at_time, "compared_training_s_at_equal_time": other_time.get(at_time, 0.0),
               "equal_time": paired(sync_final, outcomes(other_dir, at_time))}
        per_seed.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    summary = {}
    for key in ("equal_iterations", "equal_time", "sync_gain", "compared_gain"):
        diffs = [r[key]["diff"] for r in per_seed]
        mean, half = mean_interval(diffs)
        summary[key] = {"sync": mean_interval([r[key]["sync"] for r in per_seed]),
                        "compared": mean_interval([r[key]["compared"] for r in per_seed]),
                        "diff": mean, "diff_95": half, "seeds": len(diffs),
                        "seeds_compared_ahead": sum(d > 0 for d in diffs), "seeds_sync_ahead": sum(d < 0 for d in diffs)}
        if key in pooled:       # one interval over every (seed, layout) pair, the seeds' layouts as one sample
            summary[key]["pooled"] = paired(*pooled[key])
    meta = {"cpu": cpu_name(), "recipe": args.recipe, "compared": args.compared,
            "share_sft": bool(getattr(args, "share_sft", False)), "iterations": args.iterations,
            "compared_iterations": args.compared_iterations, "eval_every": args.eval_every,
            "overrides": list(args.overrides), "wall_s": time.time() - started, "out": args.out}
    report = {"meta": meta, "results": {"seeds": per_seed, "summary": summary}}
    (Path(args.out) / "parity.json").write_text(json.dumps(report, indent=2))
    return report


def pct(value: float) -> str:
    return f"{100 * value:.1f}"


def show(meta: dict, results: dict) -> None:
    print(f"{meta['recipe']}: sync ({meta['iterations']} iterations) vs {meta['compared']} "
          f"({meta['compared_iterations']}), validation every {meta['eval_every']}, on {meta['cpu']}")
    print("| seed | warm start | sync | compared, equal iterations | paired diff (95 % over layouts) | "
          "compared, equal time (iteration) | paired diff (95 %) |")
    print("|---|---|---|---|---|---|---|")
    for r in results["seeds"]:
        it, tm = r["equal_iterations"], r["equal_time"]
        print(f"| {r['seed']} | {pct(r['warm_start'])} % | {pct(it['sync'])} % | {pct(it['compared'])} % | "
              f"{pct(it['diff'])} +- {pct(it['diff_95'])} | {pct(tm['compared'])} % ({r['equal_time_iteration']}) | "
              f"{pct(tm['diff'])} +- {pct(tm['diff_95'])} |")
    for key, label in (("equal_iterations", "equal iterations"), ("equal_time", "equal wall-clock time")):
        s = results["summary"][key]
        print(f"{label}: sync {pct(s['sync'][0])} +- {pct(s['sync'][1])} %, compared {pct(s['compared'][0])} +- "
              f"{pct(s['compared'][1])} %, paired diff {pct(s['diff'])} +- {pct(s['diff_95'])} points over "
              f"{s['seeds']} seeds ({s['seeds_compared_ahead']} ahead, {s['seeds_sync_ahead']} behind)"
              + pooled_text(s))
    for key, label in (("sync_gain", "sync's gain over its warm start"), ("compared_gain", "compared's gain over its warm start")):
        s = results["summary"][key]
        print(f"{label}: {pct(s['sync'][0])} -> {pct(s['compared'][0])} %, paired gain {pct(s['diff'])} +- "
              f"{pct(s['diff_95'])} points over {s['seeds']} seeds ({s['seeds_compared_ahead']} up, "
              f"{s['seeds_sync_ahead']} down)" + pooled_text(s))


def pooled_text(summary: dict) -> str:
    p = summary.get("pooled")
    return "" if not p else f"; pooled over {p['layouts']} (seed, layout) pairs {pct(p['diff'])} +- {pct(p['diff_95'])}"


def run(args) -> int:
    return run_report(args, measure, show)


__all__ = ["mean_interval", "paired", "training_seconds"]
