"""``agentrl bench envs``: environment steps per second, in process and through the pool servers.

For every registered environment that can be built here (the others are skipped with the reason),
episodes follow the expert's plan with one invalid command mixed in every 5 steps, tasks cycling
through the first ``--tasks`` tasks of a split (each reset once before timing, so environments
that cache per-task data are measured warm, as in training where a task is replayed by G
rollouts); resets are counted in the time but not as steps. Three ways are measured:

``in-process``  one instance, stepped directly (one core);
``ray``         a pool of ``--pool-size`` instances in ``--shards`` Ray actors, stepped in batches
                through :class:`~agentrl.envs.server.client.EnvClient`;
``http``        the same pool behind the HTTP server (``agentrl envs serve``), same client.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Iterator

from agentrl.envs import TaskRef, env_names, make_env
from agentrl.envs.server.client import EnvClient
from agentrl.envs.server.http_server import ShardedHTTPServer

HELP = "environment steps/s: in process and through the pool server over Ray and HTTP"
INVALID_COMMAND = "look at the sky"


def add_served_pool_arguments(parser) -> None:
    """The flags of a measurement against a served pool (this bench and ``agentrl bench env-server``)."""
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement (default 3)")
    parser.add_argument("--pool-size", type=int, default=32, help="instances in the served pool (default 32)")
    parser.add_argument("--shards", type=int, default=2, help="processes of the served pool (default 2)")
    parser.add_argument("--split", default=None, help="split to draw tasks from (default: the largest)")
    parser.add_argument("--tasks", type=int, default=64,
                        help="tasks cycled through, each reset once before timing (default 64)")


def add_arguments(parser) -> None:
    names = ",".join(env_names())
    parser.add_argument("--envs", default=names, help=f"comma-separated environments (default: {names})")
    add_served_pool_arguments(parser)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray measurement")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP measurement")


def episode_actions(plan: list[str]) -> list[str]:
    actions = []
    for n, action in enumerate(plan):
        if n % 5 == 4:
            actions.append(INVALID_COMMAND)
        actions.append(action)
    return actions


def bench_in_process(env_name: str, split: str, seconds: float, tasks: int) -> dict[str, Any]:
    env = make_env(env_name)
    size = min(tasks, env.split_sizes()[split])
    for index in range(size):
        env.reset(TaskRef(split, index))
        env.expert_actions()
    steps = resets = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.reset(TaskRef(split, resets % size))
        resets += 1
        for action in episode_actions(env.expert_actions()):
            _, _, terminated, truncated, _ = env.step(action)
            steps += 1
            if terminated or truncated:
                break
    elapsed = time.perf_counter() - start
    return {"steps": steps, "resets": resets, "seconds": elapsed, "steps_per_s": steps / elapsed}


def play_expert_plans(client, ids: list[int]) -> Iterator[tuple[list, float]]:
    """The instances ``ids`` of ``client`` (just reset) play their experts' plans in batched steps;
    yields each batch's step results and seconds. An instance leaves once its episode ends."""
    plans = {i: episode_actions(p) for i, p in zip(ids, client.expert_actions(ids))}
    live = set(ids)
    for k in range(max(len(p) for p in plans.values())):
        batch = [(i, plans[i][k]) for i in ids if i in live and k < len(plans[i])]
        if not batch:
            break
        t = time.perf_counter()
        results = client.step(batch)
        yield results, time.perf_counter() - t
        live.difference_update(r.instance_id for r in results if r.terminated or r.truncated)


def bench_client(client, split: str, seconds: float, tasks: int) -> dict[str, Any]:
    """Batched rollouts over all instances of ``client``: reset all, step the live ones, repeat."""
    size = min(tasks, client.split_sizes[split])
    ids = list(range(client.size))
    for shift in range(size):  # every instance meets every task once: warm caches on all shards
        client.reset([(i, TaskRef(split, (shift + i) % size)) for i in ids])
        client.expert_actions(ids)
    steps = resets = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        client.reset([(i, TaskRef(split, (resets + i) % size)) for i in ids])
        resets += len(ids)
        for results, _ in play_expert_plans(client, ids):
            steps += len(results)
    elapsed = time.perf_counter() - start
    return {"steps": steps, "resets": resets, "seconds": elapsed, "steps_per_s": steps / elapsed}


def bench_ray(env_name: str, split: str, args) -> dict[str, Any]:
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(num_cpus=max(2, args.shards), include_dashboard=False, log_to_driver=False)
    try:
        cpus = min(1.0, ray.cluster_resources().get("CPU", 1) / args.shards)
        client = EnvClient.ray(env_name, args.pool_size, num_shards=args.shards, num_cpus_per_shard=cpus)
        try:
            return bench_client(client, split, args.seconds, args.tasks)
        finally:
            client.close()
    finally:
        if started_here:
            ray.shutdown()


def bench_http(env_name: str, split: str, args) -> dict[str, Any]:
    server = ShardedHTTPServer(env_name, args.pool_size, shards=args.shards)
    server.start_background()
    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}") as client:
            return bench_client(client, split, args.seconds, args.tasks)
    finally:
        server.close()


def run(args) -> int:
    results: dict[str, Any] = {}
    names = [n.strip() for n in args.envs.split(",") if n.strip()]
    for name in names:
        try:
            env = make_env(name)
            sizes = env.split_sizes()
            split = args.split or max(sizes, key=sizes.get)
            if split not in sizes:
                raise ValueError(f"no split {split!r} (has {sorted(sizes)})")
            env.reset(TaskRef(split, 0))
            env.expert_actions()
        except Exception as err:  # noqa: BLE001 - an env that cannot be built here is skipped
            reason = f"{type(err).__name__}: {err}"
            results[name] = {"skipped": reason}
            if not args.json:
                print(f"{name}: skipped ({reason})")
            continue
        entry: dict[str, Any] = {"split": split}
        ways = [("in-process", lambda: bench_in_process(name, split, args.seconds, args.tasks))]
        if not args.no_ray:
            ways.append((f"ray ({args.pool_size} envs, {args.shards} actors)", lambda: bench_ray(name, split, args)))
        if not args.no_http:
            ways.append((f"http ({args.pool_size} envs, {args.shards} processes)",
                         lambda: bench_http(name, split, args)))
        for label, measure in ways:
            try:
                entry[label] = measure()
            except Exception as err:  # noqa: BLE001 - report and go on with the other measurements
                entry[label] = {"error": f"{type(err).__name__}: {err}"}
            if not args.json:
                value = entry[label]
                shown = f"{value['steps_per_s']:,.0f} steps/s ({value['steps']} steps, {value['resets']} resets)" \
                    if "steps_per_s" in value else f"failed: {value['error']}"
                print(f"{name:10s} {label:32s} {shown}", flush=True)
        results[name] = entry
    if args.json:
        print(json.dumps(results, indent=2))
    return 0
