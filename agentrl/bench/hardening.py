"""``agentrl bench hardening``: the HTTP servers under attack, this tree against an earlier revision's
(``--baseline REV``, default 85d0bf4: before the connection limits; its ``agentrl/`` taken from git),
in one run (docs/benchmarks.md, "The servers under attack"; docs/reliability.md, "Limits").

Each attack runs against a fresh server of each tree, in alternating order (new, old; then old, new
for the next attack), while a legitimate client plays and ``/health`` is probed every 20 ms
(:mod:`agentrl.bench._attacks`):

* ``none``: no attack (the reference);
* ``idle``: ``--idle`` connections held open (silent, after ``/health``, after a 401) against an env
  server whose file limit is ``--file-limit``;
* ``heads``: ``--heads`` request heads of ``--head-mib`` MiB each at once;
* ``bodies``: ``--bodies`` authenticated heads that claim 16 MiB of body and send none;
* ``request``: one gateway request of ``--request-mib`` MiB with a valid key (the legitimate client
  makes small chat calls with another key).

Reported per attack and tree: ``/health`` p50/p99/max, the legitimate calls' p50/p99/max (env steps
and resets, or chat calls), failed probes and calls, episodes lost, the server's memory growth.
``--baseline none`` measures this tree alone.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import agentrl
from agentrl.bench._attacks import (ClaimedBodies, HugeHeads, HugeRequest, IdleConnections, Watch, start_env_server,
                                    start_gateway)
from agentrl.bench._common import cpu_name, extract_revision, run_report
from agentrl.errors import UsageError
from agentrl.runtime.http_connections import raise_file_limit

HELP = ("the env server and the gateway under attack (idle connections, huge heads, claimed bodies, a huge "
        "request): /health and a legitimate client's latency, memory; this tree against --old")
ATTACKS = ("none", "idle", "heads", "bodies", "request")
DEFAULT_BASELINE = "85d0bf4"
THIS_TREE = str(Path(agentrl.__file__).resolve().parents[1])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, metavar="REV",
                        help=f"git revision whose servers are attacked too (default {DEFAULT_BASELINE}, before the "
                             "connection limits; 'none': this tree alone); needs a git checkout of agentrl")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma-separated, of {', '.join(ATTACKS)}")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each attack is held (default 5)")
    parser.add_argument("--file-limit", type=int, default=1024, help="the env server's file limit in 'idle' (1024)")
    parser.add_argument("--idle", type=int, default=1100, help="connections of 'idle' (default 1100)")
    parser.add_argument("--heads", type=int, default=2, help="concurrent heads of 'heads' (default 2)")
    parser.add_argument("--head-mib", type=int, default=32, help="MiB per head of 'heads' (default 32)")
    parser.add_argument("--bodies", type=int, default=8, help="claimed bodies of 'bodies' (default 8)")
    parser.add_argument("--request-mib", type=int, default=4, help="MiB of the request of 'request' (default 4)")


def attack_for(name: str, args: argparse.Namespace):
    return {"none": lambda: None, "idle": lambda: IdleConnections(args.idle),
            "heads": lambda: HugeHeads(args.heads, args.head_mib << 20), "bodies": lambda: ClaimedBodies(args.bodies),
            "request": lambda: HugeRequest(args.request_mib << 20)}[name]()


def measure_once(tree: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One attack against a fresh server of ``tree``: the watch's figures and what the server answered."""
    served = (start_gateway(tree) if name == "request" else
              start_env_server(tree, file_limit=args.file_limit if name == "idle" else None))
    attack = attack_for(name, args)
    try:
        watch = Watch(served).start()
        time.sleep(1.0)
        started = time.monotonic()
        if attack is not None:
            attack.start(served)
            if name in ("heads", "request"):
                attack.wait(600.0)      # until the server has dealt with it (the stall is what is measured)
        time.sleep(max(0.0, args.seconds - (time.monotonic() - started)))
        figures = watch.stop()
        figures["attack_s"] = round(time.monotonic() - started, 2)
        figures["answers"] = attack.outcome if attack is not None else {}
    finally:
        if attack is not None:
            attack.stop()
        served.stop()
    return figures


def measure(args: argparse.Namespace) -> dict[str, Any]:
    raise_file_limit()      # this process holds the attacking connections
    names = [n.strip() for n in args.attacks.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ATTACKS))
    if unknown:
        raise UsageError(f"bench hardening: unknown attack(s) {', '.join(unknown)}; choose from {', '.join(ATTACKS)}")
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-baseline-") as scratch:
        trees = {"new": THIS_TREE}
        if args.baseline != "none":
            trees["old"] = str(extract_revision(args.baseline, Path(scratch), "hardening"))
        for n, name in enumerate(names):
            order = list(trees) if n % 2 == 0 else list(trees)[::-1]
            results[name] = {kind: measure_once(trees[kind], name, args) for kind in order}
    return {"meta": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
                     "load_after": [round(x, 2) for x in os.getloadavg()], "baseline": args.baseline,
                     "settings": {k: getattr(args, k) for k in ("seconds", "file_limit", "idle", "heads", "head_mib",
                                                                "bodies", "request_mib")},
                     "date": time.strftime("%Y-%m-%d")},
            "results": results}


def show(meta: dict[str, Any], results: dict[str, Any]) -> None:
    print(f"{meta['cpu']} ({meta['cores']} cores), load {meta['load_before'][0]} -> {meta['load_after'][0]}; "
          f"settings {meta['settings']}")
    print(f"{'attack':8s} {'tree':4s} {'health p50/p99/max ms':>24s} {'call p50/p99/max ms':>26s} "
          f"{'failed probes, calls':>20s} {'lost':>5s} {'mem +MB':>8s}  server's answers")
    for name, by_tree in results.items():
        for kind, f in by_tree.items():
            health = f"{f['health_p50_ms']}/{f['health_p99_ms']}/{f['health_max_ms']}"
            calls = f"{f['call_p50_ms']}/{f['call_p99_ms']}/{f['call_max_ms']}"
            failed = f"{f['health_failed']}/{f['health_probes']} {f['calls_failed']}/{f['calls']}"
            print(f"{name:8s} {kind:4s} {health:>24s} {calls:>26s} {failed:>20s} {f['episodes_lost']:>5d} "
                  f"{f['rss_growth_mb']:>8.1f}  {f['answers']}")


def run(args: argparse.Namespace) -> int:
    return run_report(args, measure, show)
