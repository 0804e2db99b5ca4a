"""``agentrl inspect RUN [--iteration N] [--estimators NAME ...] [--out FILE]``."""

from __future__ import annotations

from pathlib import Path

HELP = "write one HTML page of a saved training batch: every estimator's advantages and step groups side by side"
TORCH_COMPUTE = True    # see agentrl.cli.main
DESCRIPTION = ("Read a batch that `agentrl train` saved (logging.save_batches=N) and write one self-contained HTML "
               "page (no server, no network): each task group's trajectories as step rows, and the advantage every "
               "estimator gives each step on that very batch, on one colour scale, with the step groups each "
               "formed (click an advantage to highlight its group). Default: every built-in estimator configured "
               "from the run's config.yaml, plus the run's own; the newest saved iteration; the page beside the run "
               "(<run>/inspect_iter_N.html).")


def add_arguments(parser) -> None:
    parser.add_argument("run", help="a run directory (runs/<recipe>-seed<seed>)")
    parser.add_argument("--iteration", type=int, default=None, help="a saved iteration (default: the newest)")
    parser.add_argument("--estimators", nargs="+", default=None, metavar="NAME",
                        help="estimators to show: built-in names or import paths package.module:Class")
    parser.add_argument("--out", default=None, help="the HTML file to write (default: <run>/inspect_iter_N.html)")


def run(args) -> int:
    from agentrl.evaluation.inspector import inspect_run

    out = inspect_run(Path(args.run).expanduser(), args.iteration, args.estimators,
                      Path(args.out).expanduser() if args.out else None)
    print(out)
    return 0
