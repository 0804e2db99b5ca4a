"""Start (or join) the Ray cluster a run's actors live in, and survive a slow start.

``start_ray(cfg)`` joins the cluster ``RAY_ADDRESS`` names, or starts a local one with a CPU slot
for every actor the run creates (rollout workers, env servers, learner ranks beyond the first).

Ray waits a fixed 30 s for a new local node's raylet to register with its GCS and then raises
``Exception("The current node timed out during startup ...")``. On a loaded machine (several runs
or a test suite starting at once on two cores) that wait is not enough, and the run would die
before its first iteration. So a local start that times out is retried (``RAY_START_ATTEMPTS`` in
all, waiting longer before each retry): the half-started node's processes (GCS, raylet, reaper
and the like, the children this process spawned during the attempt) are killed first, so they
neither hold ports nor compete for the cores. When every attempt fails the error names the
machine's load and the two ways out: run fewer jobs at once, or start Ray once yourself
(``ray start --head``) and point the runs at it with ``RAY_ADDRESS``.
"""

from __future__ import annotations

import os
import time
from typing import Callable

RAY_START_ATTEMPTS = 3
RETRY_WAIT_S = 5.0          # before the second attempt; doubled before each later one
STARTUP_TIMEOUT_TEXT = "timed out during startup"


class RayStartError(RuntimeError):
    """The local Ray node did not start in any of the attempts."""


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _kill_new_children(before: set[int]) -> int:
    """Kill the processes this process spawned since ``before`` was taken; how many there were."""
    import psutil

    stray = []
    for pid in _children() - before:
        try:
            stray.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    for proc in stray:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(stray, timeout=10)
    return len(stray)


def init_local_ray(num_cpus: int, attempts: int = RAY_START_ATTEMPTS, wait_s: float = RETRY_WAIT_S,
                   log: Callable[[str], None] = print) -> None:
    """``ray.init`` of a local node with ``num_cpus`` slots, retried when its startup times out."""
    import ray

    for attempt in range(1, attempts + 1):
        before = _children()
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this timeout
            if STARTUP_TIMEOUT_TEXT not in str(exc):
                raise
            killed = _kill_new_children(before)
            if ray.is_initialized():
                ray.shutdown()
            if attempt == attempts:
                load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
                raise RayStartError(
                    f"the local Ray node did not start: its raylet did not register within Ray's 30 s, "
                    f"{attempts} times (load average {load} on {os.cpu_count()} cores). The machine is "
                    "too busy to start Ray: run fewer jobs at once (a sweep's `concurrency`), or start Ray "
                    "once yourself (`ray start --head --num-cpus N`) and set RAY_ADDRESS=auto for the runs"
                ) from exc
            pause = wait_s * 2 ** (attempt - 1)
            log(f"[agentrl] Ray's local node timed out during startup (attempt {attempt} of {attempts}); "
                f"killed its {killed} half-started processes, retrying in {pause:.0f} s")
            time.sleep(pause)


def start_ray(cfg) -> None:
    """A local Ray cluster (or the one RAY_ADDRESS points at) with room for every actor we start."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    needed = cfg.rollout.num_workers + cfg.env.num_servers + (cfg.learner.num_ranks if cfg.learner.num_ranks > 1 else 0)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        init_local_ray(max(os.cpu_count() or 1, needed))
