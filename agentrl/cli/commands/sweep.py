"""``agentrl sweep sweep=FILE [out=DIR] [--concurrency N] [--dry-run]``: a resumable grid of runs."""

from __future__ import annotations

import argparse
import json

from agentrl.errors import UsageError
from agentrl.cli.commands._common import split_late_flags

HELP = "run a grid of recipes x variants x seeds as training runs, resumable, with a manifest"
DESCRIPTION = ("Run every cell of a sweep file (recipes x variants x seeds, see docs/evaluation.md) as its own "
               "`agentrl train` subprocess (then `agentrl eval` when the file has an eval section), each with its "
               "run directory under the sweep's output directory. manifest.json records each cell's state; a "
               "restart skips the finished cells. A failed cell is reported and does not stop the others; the "
               "exit status is 1 when any cell failed.")


def _add_flags(parser) -> None:
    parser.add_argument("--concurrency", type=int, default=None, help="cells at once (overrides the file)")
    parser.add_argument("--skip-failed", action="store_true", help="do not run again the cells that failed before")
    parser.add_argument("--dry-run", action="store_true", help="list the cells and their commands, run nothing")


def add_arguments(parser) -> None:
    # REMAINDER: key=value arguments and flags may come in any order (flags after them are parsed in run)
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="sweep=FILE|out=DIR",
                        help="sweep=FILE (required), out=DIR (overrides the file's output_dir)")
    _add_flags(parser)


def run(args) -> int:
    options = {}
    for item in split_late_flags(args, "agentrl sweep", _add_flags):
        key, sep, value = item.partition("=")
        if not sep or key not in ("sweep", "out"):
            raise UsageError(f"unexpected argument {item!r}: sweep takes sweep=FILE and out=DIR")
        options[key] = value
    if "sweep" not in options:
        raise UsageError("sweep needs sweep=FILE (a YAML grid, see docs/evaluation.md)")
    from agentrl.evaluation.sweep import SweepRunner, load_sweep

    spec = load_sweep(options["sweep"], options.get("out"))
    if args.concurrency is not None:
        if args.concurrency < 1:
            raise UsageError("--concurrency must be >= 1")
        spec.concurrency = args.concurrency
    if args.dry_run:
        for cell in spec.cells:
            run_dir = spec.output_dir / "runs" / cell.name
            steps = [cell.train_args(spec.output_dir / "runs")] + [a for a in [spec.eval_args(run_dir)] if a]
            print(cell.name + "\n" + "\n".join("  agentrl " + " ".join(s) for s in steps))
        return 0
    runner = SweepRunner(spec, retry_failed=not args.skip_failed, log=lambda t: print(f"[sweep] {t}", flush=True))
    report = runner.run()
    print(json.dumps({k: v for k, v in report.items() if k != "failed"}))
    for name, failure in report["failed"].items():
        print(f"[sweep] failed: {name} (exit {failure['returncode']}), log {failure['log']}; last lines:")
        print("\n".join("    " + line for line in (failure["error"] or "").splitlines()[-10:]))
    return 1 if report["failed"] else 0
