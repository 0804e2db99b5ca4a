"""``agentrl bench alfworld-steps``: ALFWorld engine steps/s in one process and over a process pool.

For each pool size of ``--workers`` (default 1 and the number of cores), as many envs as workers run
in an :class:`~agentrl_env_alfworld.pool.ALFWorldPool`, one per process. Each of ``--episodes``
rounds resets every env to the next game of ``--split`` and plays up to ``--steps`` random
admissible commands. Step time and reset time (loading a game) are timed separately; both are
wall-clock over the whole pool, so with N processes they count the steps of all of them.

The environment's package (``agentrl_env_alfworld``, a distribution of its own that a learner's install may
not have) and the servers are imported inside the functions that use them, so that ``agentrl bench``
lists this benchmark wherever agentrl is installed.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

from agentrl.envs import TaskRef

HELP = "ALFWorld engine steps/s and resets/s, random admissible play, in 1 and N worker processes"


def add_arguments(parser) -> None:
    parser.add_argument("--data-dir", default=None, help="games to play (default: as the env resolves it)")
    parser.add_argument("--split", default="valid_seen")
    parser.add_argument("--episodes", type=int, default=6, help="episodes per process (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=20, help="random admissible steps per episode")
    parser.add_argument("--workers", type=int, nargs="*", default=None,
                        help="pool sizes to measure (default: 1 and the number of cores)")


def measure_pool(workers: int, data_dir: str | None, split: str = "valid_seen", episodes: int = 6,
                 steps: int = 20, seed: int = 0) -> dict[str, Any]:
    """Random admissible play on ``workers`` envs, one per process; steps/s and resets/s overall."""
    from agentrl_env_alfworld.data import resolve_data_dir
    from agentrl_env_alfworld.pool import ALFWorldPool
    from agentrl_env_alfworld.tasks import list_split_games

    data_dir = resolve_data_dir(data_dir)
    n_games = len(list_split_games(data_dir, split))
    rng = random.Random(seed)
    total_steps = total_resets = 0
    reset_seconds = step_seconds = 0.0
    start = time.perf_counter()
    with ALFWorldPool(workers, workers=workers, data_dir=data_dir) as pool:
        for episode in range(episodes):
            tasks = {i: TaskRef(split, (episode * workers + i) % n_games) for i in range(workers)}
            t0 = time.perf_counter()
            infos = {i: info for i, (_, info) in pool.reset(tasks).items()}
            reset_seconds += time.perf_counter() - t0
            total_resets += workers
            active = set(infos)
            for _ in range(steps):
                if not active:
                    break
                actions = {i: rng.choice(infos[i]["admissible_actions"]) for i in sorted(active)}
                t0 = time.perf_counter()
                results = pool.step(actions)
                step_seconds += time.perf_counter() - t0
                total_steps += len(actions)
                for i, (_, _, term, trunc, info) in results.items():
                    infos[i] = info
                    if term or trunc:
                        active.discard(i)
    return {"workers": workers, "steps": total_steps, "resets": total_resets,
            "steps_per_s": total_steps / step_seconds if step_seconds else 0.0,
            "resets_per_s": total_resets / reset_seconds if reset_seconds else 0.0,
            "seconds": time.perf_counter() - start, "split": split}


def run(args) -> int:
    sizes = args.workers or sorted({1, os.cpu_count() or 1})
    results = [measure_pool(size, args.data_dir, args.split, args.episodes, args.steps) for size in sizes]
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            print(f"workers={r['workers']}: {r['steps_per_s']:.2f} steps/s ({r['steps']} steps), "
                  f"{r['resets_per_s']:.2f} resets/s, {r['seconds']:.1f} s")
    return 0
