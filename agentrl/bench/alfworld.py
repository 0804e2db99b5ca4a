"""``agentrl bench alfworld``: ALFWorld at the paper's batch, and what a bigger node needs.

Three parts, each optional:

``generate``  (``--generate N``) N train games made by ``agentrl envs alfworld generate``'s code with
              ``--gen-workers`` processes into a fresh directory: seconds per game, and the time
              projected for the paper's 3,827 games (3,553 + 140 + 134) at the measured rate;
``pool``      ``--tasks`` x ``--group-size`` (default 16 x 8 = 128) ALFWorld instances in Ray pool
              actors (:func:`~agentrl.envs.server.ray_pool.launch_ray_shards`), once for each count
              of ``--shards`` (default 1 and 2), stepped in batches through
              :class:`~agentrl.envs.server.client.EnvClient` as the trainer does. Each round resets
              the 128 instances to ``--tasks`` new train games (group g's 8 instances share game g,
              all on one shard), then plays every instance's expert walkthrough with one invalid
              command every 5 steps (as ``agentrl bench envs``). Measured: seconds to reset the batch
              (each game loaded for the first time in its process: the engine translates it),
              batched env steps/s, and the memory of the actor processes (RSS and USS from
              ``/proc``) after the rounds, per game;
``sizing``    from the pool numbers: memory and expected steps/s of ``W`` workers on a
              ``--node-cores`` node (default 64), one core per worker, steps/s linear in W at the
              per-worker rate measured with 2 workers (and, as an upper line, at the 1-worker
              rate); memory = W x per-process cost + games x per-game cost, the two costs solved
              from the 1- and 2-worker totals (RSS after the rounds); batch reset time divided by W
              up to one game per worker.

Games come from ``--data-dir``, else the ``--generate`` sample (when made), else wherever the env
resolves them (``$ALFWORLD_DATA``, or the generated default set).

The environment's package (``agentrl_env_alfworld``, a distribution of its own that a learner's install may
not have) and the servers are imported inside the functions that use them, so that ``agentrl bench``
lists this benchmark wherever agentrl is installed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from agentrl.bench._common import cpu_name, run_report
from agentrl.bench.envs import play_expert_plans

HELP = ("ALFWorld at the paper's batch (16 tasks x 8): generation rate, memory per game, reset time and "
        "steps/s through 1 and 2 Ray pool workers, a sizing table for a 64-core node")


def add_arguments(parser) -> None:
    parser.add_argument("--data-dir", default=None, help="games to play (default: see the module help)")
    parser.add_argument("--split", default="train", help="split the pool plays (default train)")
    parser.add_argument("--tasks", type=int, default=16, help="games per round (default 16)")
    parser.add_argument("--group-size", type=int, default=8, help="instances per game (default 8)")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2],
                        help="pool worker processes (Ray actors) to measure (default 1 2)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds per pool size, each on --tasks new games (default 2)")
    parser.add_argument("--generate", type=int, default=0, metavar="N",
                        help="also time the generation of N train games (default 0: skip)")
    parser.add_argument("--gen-workers", type=int, default=2, help="generation processes (default 2)")
    parser.add_argument("--node-cores", type=int, default=64, help="cores of the node to size (default 64)")
    parser.add_argument("--no-pool", action="store_true", help="skip the pool measurement")


# ----- generation --------------------------------------------------------------------------------
def measure_generation(n: int, workers: int, out: str) -> dict[str, Any]:
    from agentrl_env_alfworld.generate import generate_games
    from agentrl_env_alfworld.tasks import PAPER_SPLIT_SIZES

    start = time.perf_counter()
    report = generate_games(out, {"train": n}, seed=0, workers=workers)
    seconds = time.perf_counter() - start
    paper = sum(PAPER_SPLIT_SIZES.values())
    return {"games": report["generated"], "workers": workers, "seconds": seconds,
            "games_per_s": report["generated"] / seconds, "seconds_per_game_per_worker": seconds * workers / n,
            "paper_games": paper, "projected_paper_seconds": paper * seconds / n}


# ----- the pool ----------------------------------------------------------------------------------
def _memory_mb(pids: list[int]) -> dict[str, float]:
    """Summed RSS and USS (private pages) of ``pids``, from ``/proc/<pid>/smaps_rollup``."""
    rss = uss = 0
    for pid in pids:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "Rss":
                    rss += int(rest.split()[0])
                elif key in ("Private_Clean", "Private_Dirty"):
                    uss += int(rest.split()[0])
    return {"rss_mb": rss / 1024, "uss_mb": uss / 1024}


def measure_pool(data_dir: str, split: str, tasks: int, group: int, shards: int, rounds: int) -> dict[str, Any]:
    """``tasks`` x ``group`` instances over ``shards`` Ray actors (Ray must be initialised)."""
    import ray

    from agentrl.envs import TaskRef
    from agentrl.envs.server.client import EnvClient
    from agentrl.envs.server.ray_pool import launch_ray_shards

    size = tasks * group
    t0 = time.perf_counter()
    cpus = min(1.0, ray.cluster_resources().get("CPU", 1) / shards)
    actors = launch_ray_shards("alfworld", size, {"data_dir": data_dir}, num_shards=shards, num_cpus_per_shard=cpus)
    client = EnvClient.ray_actors(actors, owned=True)
    try:
        start_s = time.perf_counter() - t0
        pids = ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in actors])
        idle = _memory_mb(pids)
        n_games = client.split_sizes[split]
        if n_games < tasks:
            raise ValueError(f"{split} has {n_games} games, fewer than --tasks {tasks}")
        ids = list(range(size))
        steps = batches = 0
        reset_s: list[float] = []
        step_s = 0.0
        won = 0
        for r in range(rounds):
            games = [(r * tasks + g) % n_games for g in range(tasks)]
            t = time.perf_counter()
            resets = client.reset([(i, TaskRef(split, games[i // group])) for i in ids])
            reset_s.append(time.perf_counter() - t)
            bad = [x.error for x in resets if not x.ok]
            if bad:
                raise RuntimeError(f"reset failed: {bad[0]}")
            for results, seconds in play_expert_plans(client, ids):
                step_s += seconds
                batches += 1
                for res in results:
                    steps += 1
                    if not res.ok:
                        raise RuntimeError(f"step failed: {res.error}")
                    if res.terminated or res.truncated:
                        won += bool(res.info.get("won"))
        loaded = _memory_mb(pids)
    finally:
        client.close()
    return {"shards": shards, "instances": size, "tasks": tasks, "group_size": group, "rounds": rounds,
            "start_s": start_s, "reset_batch_s": reset_s, "reset_batch_s_mean": sum(reset_s) / len(reset_s),
            "steps": steps, "batches": batches, "step_seconds": step_s, "steps_per_s": steps / step_s,
            "steps_per_s_per_worker": steps / step_s / shards,
            "batched_step_ms": 1000 * step_s / batches, "episodes_won": won, "episodes": size * rounds,
            "memory_idle": idle, "memory": loaded, "rss_mb_per_game": loaded["rss_mb"] / size,
            "uss_mb_per_game": loaded["uss_mb"] / size}


# ----- sizing ------------------------------------------------------------------------------------
def sizing(pools: list[dict[str, Any]], node_cores: int, games: int, tasks: int) -> dict[str, Any] | None:
    """Workers, memory and expected steps/s on a ``node_cores`` node, from the 1- and 2-worker pools.

    Batch reset time is divided by the workers up to ``tasks`` and no further: beyond one game per
    worker, each worker still loads (translates) its game once."""
    by = {p["shards"]: p for p in pools if "error" not in p}
    if 1 not in by or 2 not in by:
        return None
    one, two = by[1], by[2]
    per_process = max(0.0, two["memory"]["rss_mb"] - one["memory"]["rss_mb"])
    per_game = (one["memory"]["rss_mb"] - per_process) / one["instances"]
    per_worker_sps = two["steps_per_s"] / 2  # what one worker gave with a second one beside it
    reset_1 = one["reset_batch_s_mean"]
    rows = []
    workers = sorted({w for w in (1, 2, 4, 8, 16, 32, node_cores // 2, node_cores) if w <= node_cores})
    for w in workers:
        linear = one["steps_per_s"] * w            # the 1-worker rate on every core
        paired = per_worker_sps * w if w > 1 else one["steps_per_s"]  # the per-worker rate of 2 workers
        rows.append({"workers": w, "games_per_worker": games / w,
                     "memory_gb": (w * per_process + games * per_game) / 1024,
                     "steps_per_s": paired, "steps_per_s_linear": linear,
                     "full_batch_step_ms": 1000 * games / paired, "reset_batch_s": reset_1 / min(w, tasks)})
    return {"node_cores": node_cores, "games": games, "per_process_rss_mb": per_process,
            "per_game_rss_mb": per_game, "per_worker_steps_per_s": per_worker_sps,
            "scaling_1_to_2": two["steps_per_s"] / one["steps_per_s"], "rows": rows}


def measure(args) -> dict[str, Any]:
    meta: dict[str, Any] = {"cpu": cpu_name(), "cores": os.cpu_count(), "load_avg_start": os.getloadavg()}
    results: dict[str, Any] = {}
    data_dir = args.data_dir
    tmp = None
    try:
        if args.generate:
            tmp = tempfile.mkdtemp(prefix="agentrl-bench-alfworld-")
            results["generate"] = measure_generation(args.generate, args.gen_workers, tmp)
            data_dir = data_dir or tmp
        if not args.no_pool:
            import ray

            from agentrl_env_alfworld.data import resolve_data_dir

            data_dir = resolve_data_dir(data_dir)
            meta["data_dir"] = data_dir
            started = not ray.is_initialized()
            if started:
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                ray.init(num_cpus=max(2, *args.shards), include_dashboard=False, log_to_driver=False)
            try:
                pools = []
                for shards in args.shards:
                    try:
                        pools.append(measure_pool(data_dir, args.split, args.tasks, args.group_size, shards,
                                                  args.rounds))
                    except Exception as err:  # noqa: BLE001 - report and go on
                        pools.append({"shards": shards, "error": f"{type(err).__name__}: {err}"})
                results["pool"] = pools
            finally:
                if started:
                    ray.shutdown()
            results["sizing"] = sizing(results["pool"], args.node_cores, args.tasks * args.group_size, args.tasks)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    meta["load_avg_end"] = os.getloadavg()
    return {"meta": meta, "results": results}


def show(meta: dict[str, Any], results: dict[str, Any]) -> None:
    print(f"alfworld bench on {meta['cpu']} ({meta['cores']} cores); load average "
          f"{meta['load_avg_start'][0]:.2f} at start, {meta['load_avg_end'][0]:.2f} at end")
    gen = results.get("generate")
    if gen:
        print(f"generate: {gen['games']} games in {gen['seconds']:.1f} s with {gen['workers']} workers "
              f"({gen['games_per_s']:.2f} games/s, {gen['seconds_per_game_per_worker']:.2f} s per game per worker); "
              f"{gen['paper_games']:,} games projected {gen['projected_paper_seconds'] / 60:.1f} min")
    for p in results.get("pool", []):
        if "error" in p:
            print(f"pool, {p['shards']} workers: failed: {p['error']}")
            continue
        print(f"pool, {p['instances']} games ({p['tasks']} x {p['group_size']}) on {p['shards']} workers: "
              f"{p['steps_per_s']:.0f} steps/s, {p['steps_per_s_per_worker']:.0f} per worker ({p['steps']} steps in "
              f"{p['batches']} batches, {p['batched_step_ms']:.0f} ms per batch), "
              f"reset of the batch {p['reset_batch_s_mean']:.2f} s (rounds: "
              f"{', '.join(f'{s:.2f}' for s in p['reset_batch_s'])}), start {p['start_s']:.1f} s, "
              f"RSS {p['memory']['rss_mb']:.0f} MB ({p['rss_mb_per_game']:.2f} MB/game; USS "
              f"{p['uss_mb_per_game']:.2f}; idle {p['memory_idle']['rss_mb']:.0f} MB), "
              f"won {p['episodes_won']}/{p['episodes']}")
    s = results.get("sizing")
    if s:
        print(f"sizing for {s['games']} games on a {s['node_cores']}-core node: {s['per_process_rss_mb']:.0f} MB per "
              f"worker process + {s['per_game_rss_mb']:.2f} MB per game; {s['per_worker_steps_per_s']:.0f} steps/s "
              f"per worker (1 -> 2 workers: x{s['scaling_1_to_2']:.2f})")
        print(f"| workers | games/worker | memory | steps/s (2-worker rate, linear) | steps/s (1-worker rate, linear) "
              f"| step of all {s['games']} | batch reset |")
        for r in s["rows"]:
            print(f"| {r['workers']} | {r['games_per_worker']:g} | {r['memory_gb']:.1f} GB | {r['steps_per_s']:,.0f} | "
                  f"{r['steps_per_s_linear']:,.0f} | {r['full_batch_step_ms']:.0f} ms | {r['reset_batch_s']:.2f} s |")


def run(args) -> int:
    return run_report(args, measure, show)
