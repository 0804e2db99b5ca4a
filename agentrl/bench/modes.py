"""``agentrl bench modes``: env steps/s and iterations/hour of ``trainer.mode`` sync, one_step_off and
async, side by side on one machine.

Each mode trains the same recipe from the same warm start (the SFT cache under the scratch
directory: the first run makes it, the others load it) for ``--iterations`` iterations, in a fresh
``agentrl train`` process of its own, without validation or intermediate checkpoints. Throughput is
measured in the steady state, over the same iterations for every mode, from the wall-clock times in
``metrics.jsonl``: from the end of iteration ``--warmup`` (Ray's start, the warm start and filling the
pipeline left out) to the end of iteration ``--iterations - drain``, ``drain`` being the most
iterations any compared mode's rollout runs ahead of its learner (1 for one_step_off,
``trainer.max_staleness`` for async): in those last iterations an overlapped run has no more
rollouts to overlap with its updates, which would count against it.

* env steps/s: the sampled env steps of the iterations trained in that window (``rollout/env_steps``,
  what the learner trained on; groups dropped for staleness or filtered are not counted), divided by
  its seconds;
* iterations/hour, and the mean seconds per iteration of the update, of the learner's wait for
  rollouts (``time/rollout_s``: the rollout itself in sync) and of the rollout's wait for the next
  call (``time/rollout_wait_s``).

A mode may carry overrides of its own after ``+`` signs, e.g. ``async+trainer.max_staleness=1``. Each
entry's ratio is to the ``sync`` entry with the same overrides when there is one (the same objective
and thread settings, ``sync+learner.torch_threads=1`` for ``async+learner.torch_threads=1``), else to
plain ``sync``; the report names the baseline of each ratio. ``--rounds`` repeats the modes in turn
(sync, one_step_off, async, sync, ...) so that a drift of the machine reaches every mode alike; the
median over rounds is reported.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrl.bench._common import cpu_name, run_report
from agentrl.config import load_config
from agentrl.config.modes import training_mode
from agentrl.errors import UsageError
from agentrl.runs.tracking import read_metrics
from agentrl.runtime.child_env import child_environment

HELP = "trainer.mode sync vs one_step_off vs async: env steps/s and iterations/hour of one recipe, side by side"
MODES = ("sync", "one_step_off", "async")


def add_arguments(parser) -> None:
    parser.add_argument("--recipe", default="textcraft_grpo_tiny", help="the recipe every mode trains (default %(default)s)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated trainer.mode values, each optionally with +key=value overrides of its "
                             "own (default %(default)s)")
    parser.add_argument("--iterations", type=int, default=24, help="iterations per run (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the timing (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each mode, interleaved (default %(default)s)")
    parser.add_argument("--scratch", default=None, help="directory for the runs and the SFT cache (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run (e.g. trainer.seed=1)")


def run_mode(recipe: str, mode: str, iterations: int, scratch: Path, name: str, overrides: list[str]) -> Path:
    args = [sys.executable, "-m", "agentrl.cli.main", "train", f"recipe={recipe}", f"trainer.mode={mode}",
            f"trainer.iterations={iterations}", "trainer.eval_every=0", "trainer.eval_before_train=false",
            "trainer.save_every=0", f"trainer.output_dir={scratch / 'runs'}", f"trainer.run_name={name}",
            f"trainer.sft.cache_dir={scratch / 'sft_cache'}", "logging.wandb.mode=disabled",
            "logging.tensorboard=false", "logging.progress_bar=false", *overrides]
    # a run of its own: not the rendezvous of this process (or of a test process that holds its port)
    done = subprocess.run(args, env=child_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"agentrl train (trainer.mode={mode}) failed:\n{done.stdout[-3000:]}")
    return scratch / "runs" / name


def unused_run_name(runs: Path, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``, ... when an earlier bench in the same ``--scratch`` left a
    run of that name: ``agentrl train`` would resume that run instead of timing a new one."""
    candidate, n = name, 1
    while (runs / candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def drain_iterations(spec: str, overrides: list[str]) -> int:
    """How many iterations the rollout of ``spec`` (a mode with its ``+`` overrides) runs ahead of its
    learner: the last ones of a run have nothing left to overlap with."""
    mode, *own = spec.split("+")
    trainer_keys = [o for o in [*overrides, *own] if o.startswith("trainer.")]
    cfg = load_config(None, [*trainer_keys, f"trainer.mode={mode}"], training=False)
    return training_mode(mode).versions_ahead(cfg.trainer)


def throughput(run_dir: Path, first: int, last: int) -> dict[str, float]:
    """Env steps/s and means over iterations ``first + 1`` ... ``last``, timed from the end of ``first``."""
    records = sorted((r for r in read_metrics(run_dir / "metrics.jsonl") if "learner/loss" in r or
                      "learner/optimizer_steps" in r), key=lambda r: r["step"])
    start = next(r for r in records if r["step"] == first)
    timed = [r for r in records if first < r["step"] <= last]
    seconds = timed[-1]["time"] - start["time"]

    def mean(key: str) -> float:
        return statistics.fmean(r.get(key, 0.0) for r in timed)

    return {"env_steps_per_s": sum(r["rollout/env_steps"] for r in timed) / seconds,
            "iterations_per_hour": len(timed) / seconds * 3600, "seconds": seconds,
            "update_s": mean("time/update_s"), "rollout_s": mean("time/rollout_s"),
            "rollout_wait_s": mean("time/rollout_wait_s"), "staleness_mean": mean("async/staleness_mean"),
            "success_rate": mean("rollout/success_rate")}


def baseline_of(spec: str, specs: list[str]) -> str | None:
    """The sync entry a mode is compared with: the one with the same overrides, else plain ``sync``."""
    own = spec.split("+")[1:]
    same = "+".join(["sync", *own])
    return same if same in specs else "sync" if "sync" in specs else None


def measure(args) -> dict:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted({m.split("+")[0] for m in modes} - set(MODES))
    if unknown:
        raise UsageError(f"bench modes: unknown mode(s) {unknown} in --modes; choose from {', '.join(MODES)}")
    drain = max(drain_iterations(spec, args.overrides) for spec in modes)
    last = args.iterations - drain
    if last <= args.warmup:
        raise UsageError(f"bench modes: --iterations {args.iterations} leaves nothing to time after --warmup "
                         f"{args.warmup} and the last {drain} iteration(s) of drain; raise --iterations")
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="agentrl-bench-modes-"))
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    started = time.time()
    for round_ in range(args.rounds):
        for i, spec in enumerate(modes):
            mode, *own = spec.split("+")
            run_dir = run_mode(args.recipe, mode, args.iterations, scratch,
                               unused_run_name(scratch / "runs", f"{mode}-{i}-{round_}"), list(args.overrides) + own)
            runs[spec].append(throughput(run_dir, args.warmup, last))
    results = {}
    for spec, rounds in runs.items():
        results[spec] = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        results[spec]["rounds"] = [round(r["env_steps_per_s"], 2) for r in rounds]
    for spec in results:
        base = baseline_of(spec, modes)
        if base is not None:
            results[spec]["baseline"] = base
            results[spec]["speedup_vs_sync"] = results[spec]["env_steps_per_s"] / results[base]["env_steps_per_s"]
    meta = {"cpu": cpu_name(), "cores": len(os.sched_getaffinity(0)), "recipe": args.recipe,
            "iterations": args.iterations, "warmup": args.warmup, "timed": [args.warmup + 1, last], "drain": drain,
            "rounds": args.rounds,
            "overrides": list(args.overrides), "wall_s": time.time() - started, "scratch": str(scratch)}
    return {"meta": meta, "results": results}


def show(meta: dict, results: dict) -> None:
    first, last = meta["timed"]
    print(f"{meta['recipe']} on {meta['cpu']} ({meta['cores']} cores), iterations {first}-{last} of "
          f"{meta['iterations']} timed (the last {meta['drain']} left out: drain), {meta['rounds']} round(s), "
          f"overrides {meta['overrides'] or 'none'}")
    width = max(14, *(len(spec) + 2 for spec in results))
    print(f"{'mode':<{width}}{'env steps/s':>12}{'iter/hour':>11}{'vs sync':>9}{'update s':>10}{'rollout s':>11}"
          f"{'rollout wait s':>16}{'staleness':>11}  baseline")
    for mode, r in results.items():
        print(f"{mode:<{width}}{r['env_steps_per_s']:>12.1f}{r['iterations_per_hour']:>11.0f}"
              f"{r.get('speedup_vs_sync', float('nan')):>9.2f}{r['update_s']:>10.1f}{r['rollout_s']:>11.1f}"
              f"{r['rollout_wait_s']:>16.1f}{r['staleness_mean']:>11.2f}  {r.get('baseline', '-')}")


def run(args) -> int:
    return run_report(args, measure, show)
