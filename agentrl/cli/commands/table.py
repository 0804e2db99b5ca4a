"""``agentrl table results=DIR [--format md|latex|csv] [out=FILE] [plots=DIR] ...``: the papers' tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrl.errors import UsageError
from agentrl.cli.commands._common import split_late_flags

HELP = "the papers' tables (and learning-curve plots) from a sweep's results, with published reference rows"
DESCRIPTION = ("Collect every run under results=DIR (a sweep's output directory or any directory of run "
               "directories): `agentrl eval` summaries when present, else the validation records of metrics.jsonl. "
               "Prints one table per environment and model: ALFWorld per task type, WebShop score and success, "
               "TextCraft by depth; mean ± std over seeds with a 95% t interval, the best per column marked, the "
               "papers' published numbers as labelled reference rows. Writes learning curves (success vs "
               "iteration, one line per estimator, shaded over seeds) as PNG to plots=DIR (default DIR/plots).")

OPTIONS = ("results", "out", "plots", "metric", "split", "curve")


def _add_flags(parser) -> None:
    parser.add_argument("--format", choices=("md", "latex", "csv"), default="md", help="output format (default md)")
    parser.add_argument("--no-reference", action="store_true", help="leave out the published reference rows")
    parser.add_argument("--no-plots", action="store_true", help="write no learning-curve plots")


def add_arguments(parser) -> None:
    # REMAINDER: key=value arguments and flags may come in any order (flags after them are parsed in run)
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="results=DIR|out=FILE|plots=DIR|metric=...",
                        help="results=DIR (required); out=FILE (default: stdout); plots=DIR (default DIR/plots); "
                             "metric=final|peak for runs without an eval summary (default final); split=NAME: "
                             "which eval summary to use; curve=KEY: the metrics.jsonl key to plot")
    _add_flags(parser)


def run(args) -> int:
    options = {}
    for item in split_late_flags(args, "agentrl table", _add_flags):
        key, sep, value = item.partition("=")
        if not sep or key not in OPTIONS:
            raise UsageError(f"unexpected argument {item!r}: table takes {', '.join(k + '=' for k in OPTIONS)}")
        options[key] = value
    if "results" not in options:
        raise UsageError("table needs results=DIR (a sweep output directory or a directory of runs)")
    results = Path(options["results"]).expanduser()
    if not results.is_dir():
        raise UsageError(f"results={results} is not a directory")
    metric = options.get("metric", "final")
    if metric not in ("final", "peak"):
        raise UsageError(f"metric={metric!r}: expected final or peak")
    from agentrl.evaluation.plots import plot_learning_curves
    from agentrl.evaluation.results import collect, unfinished_cells
    from agentrl.evaluation.tables import build_tables, render

    runs = collect(results, metric=metric, split=options.get("split"))
    left_out = unfinished_cells(results)
    if left_out:
        listed = ", ".join(f"{name} ({state})" for name, state in left_out.items())
        print(f"[table] left out {len(left_out)} sweep cell(s) that are not done: {listed}", file=sys.stderr)
    if not runs:
        raise UsageError(f"no run with results under {results} (no eval summary.json nor validation metrics yet)")
    text = render(build_tables(runs, references=not args.no_reference), args.format)
    if "out" in options:
        out = Path(options["out"]).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"[table] {len(runs)} run(s) -> {out}", file=sys.stderr)
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("[table] no plots: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
            return 0
        plots = Path(options.get("plots") or results / "plots").expanduser()
        for path in plot_learning_curves(runs, plots, options.get("curve")):
            print(f"[table] plot {path}", file=sys.stderr)
    return 0
