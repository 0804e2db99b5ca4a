"""``agentrl bench env-server``: batched env steps/s through the HTTP env server against an earlier one.

Both servers run in the same run on the same machine, in alternating order each round (new, old,
old, new, ...), so a load that changes during the run weighs on both alike: the current server
(``agentrl envs serve``) and the one of an earlier revision of agentrl (``--baseline``, by default
``036ef7e^``: the hand-written stdlib server the Starlette/uvicorn one replaced), taken from git
(``git archive`` of its ``agentrl/`` package into a scratch directory) and started there as
``python -m agentrl.cli.main envs serve`` of that tree, so it needs a git checkout of agentrl. Both
are driven by the same client (:class:`~agentrl.envs.server.client.EnvClient`) with the workload of
``agentrl bench envs`` (expert plans with an invalid command every 5 steps, ``--pool-size``
instances in ``--shards`` processes, resets timed but not counted); the baseline serves its own
revision's environments and pool, so the ratio compares the two revisions' whole env serving.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import agentrl
from agentrl.bench._common import cpu_name, run_report
from agentrl.bench.envs import add_served_pool_arguments, bench_client
from agentrl.envs import make_env
from agentrl.envs.server.client import EnvClient
from agentrl.envs.server.http_server import ShardedHTTPServer
from agentrl.errors import UsageError

HELP = "batched env steps/s through the HTTP env server against an earlier revision's (from git), interleaved"
SERVERS = ("new", "old")
DEFAULT_BASELINE = "036ef7e^"      # the hand-written stdlib server, before Starlette/uvicorn
START_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--envs", default="textcraft", help="comma-separated environments (default: textcraft)")
    parser.add_argument("--rounds", type=int, default=6, help="measurements of each server (default 6)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help=f"git revision whose env server is the baseline (default {DEFAULT_BASELINE}: the stdlib "
                             "server the uvicorn one replaced); needs a git checkout of agentrl")
    add_served_pool_arguments(parser)


def extract_revision(revision: str, into: Path) -> Path:
    """agentrl's package at git ``revision`` (``git archive``) under ``into``; the directory to put on
    PYTHONPATH. A one-line error when agentrl is not a git checkout or the revision is unknown."""
    repo = Path(agentrl.__file__).resolve().parents[1]
    if not (repo / ".git").exists():
        raise UsageError(f"bench env-server takes its baseline (--baseline {revision}) from git, but {repo} is not a "
                         "git checkout of agentrl: run it from a clone")
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", revision, "agentrl"],
                             capture_output=True)
    if archive.returncode != 0:
        raise UsageError(f"--baseline {revision}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BaselineServer:
    """``agentrl envs serve`` of the extracted tree in a subprocess, ready when its ``/info`` answers."""

    def __init__(self, tree: Path, env_name: str, args: argparse.Namespace):
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentrl.cli.main", "envs", "serve", env_name, "--size", str(args.pool_size),
             "--shards", str(args.shards), "--port", str(self.port)],
            env=env, cwd=str(tree), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the baseline server exited: {self.process.stderr.read().decode()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/info", timeout=1).read()
                return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError(f"the baseline server did not answer within {START_TIMEOUT_S:.0f} s")

    def close(self) -> None:
        os.killpg(self.process.pid, 15)
        self.process.wait(timeout=30)


def measure_once(kind: str, env_name: str, split: str, args: argparse.Namespace, tree: Path) -> float:
    """Steps/s of one measurement through server ``kind`` (``new``, or ``old``: the baseline ``tree``'s)."""
    if kind == "new":
        server = ShardedHTTPServer(env_name, args.pool_size, shards=args.shards)
        server.start_background()
    else:
        server = BaselineServer(tree, env_name, args)
    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}") as client:
            return bench_client(client, split, args.seconds, args.tasks)["steps_per_s"]
    finally:
        server.close()


def _split_of(env_name: str, wanted: str | None) -> str:
    sizes = make_env(env_name).split_sizes()
    split = wanted or max(sizes, key=sizes.get)
    if split not in sizes:
        raise ValueError(f"{env_name} has no split {split!r} (has {sorted(sizes)}); pass --split")
    return split


def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-baseline-") as scratch:
        tree = extract_revision(args.baseline, Path(scratch))
        for env_name in [n.strip() for n in args.envs.split(",") if n.strip()]:
            split = _split_of(env_name, args.split)
            runs: dict[str, list[float]] = {kind: [] for kind in SERVERS}
            for n in range(args.rounds):
                for kind in (SERVERS if n % 2 == 0 else SERVERS[::-1]):
                    runs[kind].append(round(measure_once(kind, env_name, split, args, tree), 1))
            medians = {kind: statistics.median(values) for kind, values in runs.items()}
            results[env_name] = {"split": split, "steps_per_s": runs, "median": medians,
                                 "new_over_old": round(medians["new"] / medians["old"], 3)}
    return {"meta": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
                     "load_after": [round(x, 2) for x in os.getloadavg()], "pool_size": args.pool_size,
                     "baseline": args.baseline,
                     "shards": args.shards, "seconds": args.seconds, "rounds": args.rounds,
                     "date": time.strftime("%Y-%m-%d")},
            "results": results}


def show(meta: dict[str, Any], results: dict[str, Any]) -> None:
    print(f"{meta['cpu']} ({meta['cores']} cores), load {meta['load_before'][0]} -> {meta['load_after'][0]}; "
          f"{meta['pool_size']} envs in {meta['shards']} processes, {meta['rounds']} x {meta['seconds']:g} s each")
    for env_name, entry in results.items():
        for kind in SERVERS:
            values = entry["steps_per_s"][kind]
            label = "new (this tree)" if kind == "new" else f"old ({meta.get('baseline', DEFAULT_BASELINE)})"
            print(f"{env_name:10s} {label:24s} median {entry['median'][kind]:8,.0f} steps/s  "
                  f"(range {min(values):,.0f}-{max(values):,.0f})")
        print(f"{env_name:10s} new / old: {entry['new_over_old']:.3f}")


def run(args: argparse.Namespace) -> int:
    return run_report(args, measure, show)
