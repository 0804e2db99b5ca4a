"""``agentrl bench env-server``: batched env steps/s through the HTTP env server against the previous one.

Both servers run in the same run on the same machine, in alternating order each round (new, old,
old, new, ...), so a load that changes during the run weighs on both alike: the current server
(Starlette on uvicorn, ``agentrl envs serve``) and the hand-written stdlib server it replaced
(commit 036ef7e; kept as :mod:`agentrl.bench._stdlib_env_server_036ef7e`). Both serve the same
:class:`~agentrl.envs.server.pool.EnvPool` and are driven by the same client
(:class:`~agentrl.envs.server.client.EnvClient`) with the workload of ``agentrl bench envs``
(expert plans with an invalid command every 5 steps, ``--pool-size`` instances in ``--shards``
processes, resets timed but not counted), so the ratio measures the HTTP servers alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from agentrl.bench._common import cpu_name, run_report

HELP = "batched env steps/s through the HTTP env server against the previous (stdlib) server, interleaved"
SERVERS = ("new", "old")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--envs", default="textcraft", help="comma-separated environments (default: textcraft)")
    parser.add_argument("--rounds", type=int, default=6, help="measurements of each server (default 6)")
    from agentrl.bench.envs import add_served_pool_arguments

    add_served_pool_arguments(parser)


def _server(kind: str, env_name: str, args: argparse.Namespace):
    if kind == "new":
        from agentrl.envs.server.http_server import ShardedHTTPServer
    else:
        from agentrl.bench._stdlib_env_server_036ef7e import ShardedHTTPServer
    return ShardedHTTPServer(env_name, args.pool_size, shards=args.shards)


def measure_once(kind: str, env_name: str, split: str, args: argparse.Namespace) -> float:
    """Steps/s of one measurement through server ``kind`` (``new`` or ``old``)."""
    from agentrl.bench.envs import bench_client
    from agentrl.envs.server.client import EnvClient

    server = _server(kind, env_name, args)
    server.start_background()
    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}") as client:
            return bench_client(client, split, args.seconds, args.tasks)["steps_per_s"]
    finally:
        server.close()


def _split_of(env_name: str, wanted: str | None) -> str:
    from agentrl.envs import make_env

    sizes = make_env(env_name).split_sizes()
    split = wanted or max(sizes, key=sizes.get)
    if split not in sizes:
        raise ValueError(f"{env_name} has no split {split!r} (has {sorted(sizes)}); pass --split")
    return split


def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    load_before = os.getloadavg()
    for env_name in [n.strip() for n in args.envs.split(",") if n.strip()]:
        split = _split_of(env_name, args.split)
        runs: dict[str, list[float]] = {kind: [] for kind in SERVERS}
        for n in range(args.rounds):
            for kind in (SERVERS if n % 2 == 0 else SERVERS[::-1]):
                runs[kind].append(round(measure_once(kind, env_name, split, args), 1))
        medians = {kind: statistics.median(values) for kind, values in runs.items()}
        results[env_name] = {"split": split, "steps_per_s": runs, "median": medians,
                             "new_over_old": round(medians["new"] / medians["old"], 3)}
    return {"meta": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
                     "load_after": [round(x, 2) for x in os.getloadavg()], "pool_size": args.pool_size,
                     "shards": args.shards, "seconds": args.seconds, "rounds": args.rounds,
                     "date": time.strftime("%Y-%m-%d")},
            "results": results}


def show(meta: dict[str, Any], results: dict[str, Any]) -> None:
    print(f"{meta['cpu']} ({meta['cores']} cores), load {meta['load_before'][0]} -> {meta['load_after'][0]}; "
          f"{meta['pool_size']} envs in {meta['shards']} processes, {meta['rounds']} x {meta['seconds']:g} s each")
    for env_name, entry in results.items():
        for kind in SERVERS:
            values = entry["steps_per_s"][kind]
            label = "new (uvicorn)" if kind == "new" else "old (stdlib, 036ef7e^)"
            print(f"{env_name:10s} {label:24s} median {entry['median'][kind]:8,.0f} steps/s  "
                  f"(range {min(values):,.0f}-{max(values):,.0f})")
        print(f"{env_name:10s} new / old: {entry['new_over_old']:.3f}")


def run(args: argparse.Namespace) -> int:
    return run_report(args, measure, show)
