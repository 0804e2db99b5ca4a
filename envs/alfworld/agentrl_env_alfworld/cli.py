"""``agentrl envs alfworld ...``: generate games.

The engine is imported inside the run functions only, so ``agentrl --help`` stays fast and works
without ``alfworld`` installed. The engine's benchmark is ``agentrl bench alfworld-steps``; the old
spelling ``agentrl envs alfworld bench`` fails with one line naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from agentrl.errors import UsageError

MOVED_BENCH = "`agentrl envs alfworld bench` moved: run `agentrl bench alfworld-steps` (same options)"


class _MovedBench(argparse.Action):
    """Refuses the old ``bench`` subcommand, whatever follows it, as soon as it is parsed."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(MOVED_BENCH)


def add_cli(subparsers) -> None:
    from agentrl_env_alfworld.generate import SOLVERS

    parser = subparsers.add_parser("alfworld", help="ALFWorld tools: generate games",
                                   description="ALFWorld tools (real alfworld/TextWorld engine).")
    sub = parser.add_subparsers(dest="alfworld_command", metavar="TOOL", required=True)

    gen = sub.add_parser("generate", help="write solvable ALFWorld games in the official layout",
                         description="Generate ALFWorld games (json_2.1.1/{train,valid_seen,valid_unseen}/"
                         "<task>/<trial>/{game.tw-pddl,traj_data.json}) from the scene layouts the "
                         "alfworld package ships; each game is replayed to a win before it is written.")
    gen.add_argument("--out", required=True, help="output directory (use it as ALFWORLD_DATA or data_dir)")
    gen.add_argument("--n", type=int, default=144, help="number of train games (default: %(default)s)")
    gen.add_argument("--n-valid", type=int, default=None,
                     help="games in each of valid_seen and valid_unseen (default: max(6, n // 4))")
    gen.add_argument("--n-valid-seen", type=int, default=None, help="valid_seen games (overrides --n-valid)")
    gen.add_argument("--n-valid-unseen", type=int, default=None, help="valid_unseen games (overrides --n-valid)")
    gen.add_argument("--paper-sizes", action="store_true",
                     help="the official split sizes: 3,553 train, 140 valid_seen, 134 valid_unseen "
                     "(overrides the counts above)")
    gen.add_argument("--seed", type=int, default=0, help="generation seed (default: %(default)s)")
    gen.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    gen.add_argument("--solver", choices=SOLVERS, default="expert",
                     help="expert: fast omniscient expert; planner: the engine's Fast Downward planner "
                     "(minutes per game on large scenes); search: the searching expert (no hidden "
                     "information; games it cannot win in 50 steps are resampled). Default: %(default)s")
    gen.add_argument("--task-types", nargs="+", default=None, metavar="TYPE",
                     help="task families to deal round-robin (default: all six)")
    gen.add_argument("--rooms", nargs="+", default=None, choices=("kitchen", "livingroom", "bedroom", "bathroom"),
                     help="room kinds whose scenes are used (default: all)")
    gen.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    gen.set_defaults(_envs_run=run_generate)

    # no help: the moved subcommand is not listed, but its old spelling gets the one-line error
    moved = sub.add_parser("bench", add_help=False)
    moved.add_argument("old_arguments", nargs=argparse.REMAINDER, action=_MovedBench)


def generate_counts(args) -> dict[str, int]:
    """Games per split asked by ``generate``'s flags."""
    from agentrl_env_alfworld.tasks import PAPER_SPLIT_SIZES

    if args.paper_sizes:
        return dict(PAPER_SPLIT_SIZES)
    n_valid = args.n_valid if args.n_valid is not None else max(6, args.n // 4)
    return {"train": args.n,
            "valid_seen": n_valid if args.n_valid_seen is None else args.n_valid_seen,
            "valid_unseen": n_valid if args.n_valid_unseen is None else args.n_valid_unseen}


def run_generate(args) -> int:
    import sys

    from agentrl_env_alfworld.generate import generate_games

    counts = generate_counts(args)
    start = time.perf_counter()
    shown = [start]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if not args.quiet and (done == total or now - shown[0] >= 30):
            shown[0] = now
            print(f"alfworld generate: {done}/{total} games, {now - start:.0f} s", file=sys.stderr, flush=True)

    try:
        report = generate_games(args.out, counts, seed=args.seed, workers=args.workers, solver=args.solver,
                                task_types=tuple(args.task_types) if args.task_types else None,
                                rooms=tuple(args.rooms) if args.rooms else None, progress=progress)
    except ValueError as err:  # another recipe in --out, unknown task types or rooms
        print(f"agentrl envs alfworld generate: {err}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    made = report["generated"]
    print(json.dumps({"out": os.path.abspath(args.out), "games": len(report["trials"]), "counts": counts,
                      "generated": made, "skipped_finished": report["skipped"], "seed": args.seed,
                      "seconds": round(seconds, 1),
                      "games_per_s": round(made / seconds, 3) if made else None}))
    return 0

