"""Start (or join) the Ray cluster a run's actors live in, and survive a slow start.

``start_ray(cfg)`` joins the cluster ``RAY_ADDRESS`` names, or starts a local one with a CPU slot
for every actor the run creates (rollout workers, env servers, learner ranks beyond the first) and,
where CUDA is present, the GPUs this process sees, both given explicitly (:func:`init_local_ray`).

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
from typing import Callable, Sequence

from agentrl.errors import UsageError

RAY_START_ATTEMPTS = 3
RETRY_WAIT_S = 5.0          # before the second attempt; doubled before each later one
STARTUP_TIMEOUT_TEXT = "timed out during startup"


PLACEMENT_AMOUNT = 0.001    # of a node's custom resource per placed actor: a node offering 1 takes 1,000 of them
NODE_DEATH_WAIT_S = 45.0    # how long a lost actor's node may take to be marked dead by Ray (its health checks)


class RayStartError(RuntimeError):
    """The local Ray node did not start in any of the attempts."""


def placed(resources: Sequence[str], index: int) -> dict[str, float]:
    """The Ray ``resources`` request that puts actor ``index`` of a role on a node: the role's
    ``placement.*`` entry for it (repeated when the list is shorter), nothing when the list is empty."""
    if not resources:
        return {}
    return {str(resources[index % len(resources)]): PLACEMENT_AMOUNT}


BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
_NODE_RESOURCES: dict[str, list[str]] = {}     # node id -> its custom resources, seen while it was alive


def custom_resources(node: dict) -> list[str]:
    return sorted(name for name in node.get("Resources", {}) if name not in BUILTIN_RESOURCES
                  and not name.startswith("node:") and not name.startswith("accelerator_type:"))


def remember_nodes() -> None:
    """Note each live node's custom resources: Ray reports none for a node once it is dead."""
    import ray

    for node in ray.nodes():
        if node.get("Alive"):
            _NODE_RESOURCES[node["NodeID"]] = custom_resources(node)


def check_placement(cfg) -> None:
    """Every custom resource ``placement.*`` names is offered by a node of the cluster; else one line
    naming the resource, the ones the nodes offer, and how to add it."""
    import ray

    remember_nodes()
    offered = sorted({name for node in ray.nodes() if node.get("Alive") for name in custom_resources(node)})
    for role in ("learner", "rollout", "env"):
        for name in getattr(cfg.placement, role):
            if name not in offered:
                raise UsageError(f"placement.{role} names the Ray resource {name!r}, which no node of the cluster "
                                 f"offers (offered: {', '.join(offered) or 'none'}); start a node with "
                                 f"`ray start --address ... --resources='{{\"{name}\": 1}}'` or change placement.{role}")


def lost_nodes() -> list[dict]:
    """The dead nodes (``ray.nodes()`` entries) that were alive when this run started (every dead node
    when the run noted none, :func:`remember_nodes`): a cluster keeps listing nodes lost before it."""
    import ray

    return [n for n in ray.nodes() if not n.get("Alive") and (not _NODE_RESOURCES or n["NodeID"] in _NODE_RESOURCES)]


def lost_node_text(error: BaseException, wait_s: float = NODE_DEATH_WAIT_S) -> str:
    """One line on the Ray node that an actor error came from, when Ray marks one dead within
    ``wait_s`` (its id, address and custom resources), else the error's last line."""
    last = (str(error).strip().splitlines() or [type(error).__name__])[-1]
    deadline = time.monotonic() + wait_s
    while True:
        dead = lost_nodes()
        if dead:
            break
        if time.monotonic() >= deadline:
            return f"a Ray actor died ({type(error).__name__}: {last})"
        time.sleep(1.0)
    parts = []
    for node in dead:
        custom = _NODE_RESOURCES.get(node["NodeID"]) or custom_resources(node)
        parts.append(f"Ray node {node['NodeID'][:12]} ({node.get('NodeManagerAddress')}"
                     + (f", resources {', '.join(custom)}" if custom else "") + ")")
    return f"lost {' and '.join(parts)}: its actors died ({type(error).__name__})"


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


def local_gpus() -> int:
    """The CUDA devices this process sees (0 without CUDA): what a local Ray node is told it has."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def init_local_ray(num_cpus: int, attempts: int = RAY_START_ATTEMPTS, wait_s: float = RETRY_WAIT_S,
                   log: Callable[[str], None] = print, num_gpus: int | None = None) -> None:
    """``ray.init`` of a local node with ``num_cpus`` slots, retried when its startup times out.

    Where CUDA is present the node is given its GPUs too (``num_gpus``, default :func:`local_gpus`):
    Ray's own detection can fail (a sandboxed runtime without the files it reads), and a one-GPU
    actor would then wait for a GPU the node does not offer."""
    import ray

    num_gpus = local_gpus() if num_gpus is None else num_gpus
    gpus = {"num_gpus": num_gpus} if num_gpus else {}
    for attempt in range(1, attempts + 1):
        before = _children()
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, **gpus)
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
    check_placement(cfg)
