"""The plan's Ray placement group: its bundles, the bounded wait for them, and the roles' slots.

    bundles = plan_bundles(plan, cfg)                 # pure: what each role asks of Ray
    reservation = reserve(plan, cfg)                  # one placement group, granted whole or refused
    LearnerGroup(cfg, model_dir, slots=reservation.learner_slots) ...
    reservation.release()

The bundles, in plan order:

* split: each learner rank ``{GPU: 1, CPU: 1}``; each rollout engine ``{GPU: tensor_parallel_size,
  CPU: 1}``, one bundle so that its GPUs are on one node;
* colocated: each engine with its learner ranks ``{GPU: tensor_parallel_size, CPU: 1 +
  tensor_parallel_size}``: each rank takes one of the bundle's GPUs (Ray sets its
  ``CUDA_VISIBLE_DEVICES``), the engine asks for none and is started seeing all of them;
* a learner in the driver process (``learner.num_ranks=1``): ``{GPU: 1}`` on the driver's node
  (its ``node:<ip>`` resource), which no actor takes: it keeps the driver's GPU from the others
  (with a colocated engine: ``{GPU: 1, CPU: 1}``, the engine seeing that GPU);
* each env server ``{CPU: 1}``.

A role's ``placement.*`` custom resource goes into its bundles, so that pinning to nodes still
holds inside the group.

All bundles form ONE placement group (strategy PACK): Ray grants all of them at once or none, so a
cluster that can hold the learner but not the engines starts nothing, instead of starting the learner
and waiting forever for the rest. A group the cluster can never hold (more of a resource than it has)
is refused at once; one it cannot hold now is waited for ``placement.wait_s``, then removed, and the
run stops with one line: what the group asks, what the cluster has and has free.

Once granted, a probe task in each GPU bundle reports the bundle's node and GPU ids (Ray keeps a
bundle's GPUs for every task and actor in it), so the driver knows which GPU its one-rank learner
uses and a colocated engine which GPUs it shares.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from agentrl.errors import UsageError
from agentrl.placement.plan import PlacementPlan, describe_cluster, plan_placement
from agentrl.runtime.actor_slots import ActorSlot
from agentrl.runtime.ray_start import PLACEMENT_AMOUNT, start_ray

ROLE_CPUS = 1.0         # what a learner rank, a rollout worker and an env server each ask for


@dataclass(frozen=True)
class Bundle:
    role: str                   # "learner", "rollout", "colocated", "driver" or "env"
    index: int                  # the learner rank, engine or env server
    resources: dict[str, float]

    @property
    def gpus(self) -> int:
        return int(self.resources.get("GPU", 0))

    def describe(self, tp: int) -> str:
        if self.role == "learner":
            return f"learner rank {self.index}"
        if self.role == "rollout":
            return f"rollout engine {self.index} ({tp} GPU{'s' if tp > 1 else ''})"
        if self.role == "colocated":
            return f"rollout engine {self.index} with its learner ranks"
        if self.role == "driver":
            return "the driver's learner GPU"
        return f"env server {self.index}"


def _pinned(names: list, index: int) -> dict[str, float]:
    """The ``placement.*`` custom resource of actor ``index`` of a role (repeated when shorter)."""
    return {str(names[index % len(names)]): PLACEMENT_AMOUNT} if names else {}


def plan_bundles(plan: PlacementPlan, cfg, driver_node_resource: Optional[str] = None) -> list[Bundle]:
    """The placement group's bundles for ``plan`` (see the module's docstring). ``driver_node_resource``:
    the ``node:<ip>`` resource of the driver's node, which a learner in the driver pins its GPU to."""
    placement, tp = cfg.placement, plan.tensor_parallel_size
    driver_pin = {driver_node_resource: PLACEMENT_AMOUNT} if driver_node_resource else {}
    bundles: list[Bundle] = []
    if plan.layout == "split":
        if plan.learner_in_driver:
            bundles.append(Bundle("driver", 0, {"GPU": 1, **driver_pin}))
        else:
            bundles += [Bundle("learner", r.rank, {"GPU": 1, "CPU": ROLE_CPUS, **_pinned(placement.learner, r.rank)})
                        for r in plan.ranks]
        bundles += [Bundle("rollout", e.index, {"GPU": tp, "CPU": ROLE_CPUS, **_pinned(placement.rollout, e.index)})
                    for e in plan.engines]
    else:
        for e in plan.engines:
            ranks = [r.rank for r in plan.ranks if r.rank // tp == e.index]
            pins = {**_pinned(placement.rollout, e.index)}
            for rank in ranks if not plan.learner_in_driver else []:
                for name in _pinned(placement.learner, rank):
                    if pins and name not in pins:
                        raise UsageError(f"placement.layout=colocated shares rollout engine {e.index}'s GPUs with "
                                         f"learner rank {rank}, but placement.rollout and placement.learner name "
                                         f"different nodes ({', '.join(pins)} and {name}); name the same resource "
                                         "for both, or use placement.layout=split")
                    pins[name] = PLACEMENT_AMOUNT
            if plan.learner_in_driver:
                bundles.append(Bundle("colocated", e.index, {"GPU": 1, "CPU": ROLE_CPUS, **driver_pin, **pins}))
            else:
                bundles.append(Bundle("colocated", e.index,
                                      {"GPU": tp, "CPU": ROLE_CPUS * (1 + len(ranks)), **pins}))
    bundles += [Bundle("env", k, {"CPU": ROLE_CPUS, **_pinned(placement.env, k)}) for k in range(plan.env_servers)]
    return bundles


def requested(bundles: list[Bundle]) -> dict[str, float]:
    """What the whole group asks, resource by resource."""
    total: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.resources.items():
            total[name] = total.get(name, 0.0) + amount
    return total


@dataclass
class Reservation:
    """A granted placement group and the slots of the roles' actors in it."""

    placement_group: Any
    bundles: list[Bundle]
    colocated: bool = False                 # engines share their GPUs with learner ranks
    learner_slots: list[ActorSlot] = field(default_factory=list)    # empty: the learner is in the driver
    rollout_slots: list[ActorSlot] = field(default_factory=list)
    env_slots: list[ActorSlot] = field(default_factory=list)
    driver_gpu: Optional[str] = None        # the GPU id (Ray's) of a learner in the driver
    driver_node: str = ""                   # the node of that GPU: the driver's
    bundle_gpus: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)   # bundle -> (node id, GPU ids)

    def driver_device_index(self) -> Optional[int]:
        """The CUDA device index of :attr:`driver_gpu` in this process (its place in this process's
        ``CUDA_VISIBLE_DEVICES``, else the id itself)."""
        if self.driver_gpu is None:
            return None
        visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        return visible.index(self.driver_gpu) if self.driver_gpu in visible else int(self.driver_gpu)

    def describe(self, tp: int) -> list[str]:
        """One line per GPU bundle: which role, on which node, with which GPU ids."""
        return [f"{self.bundles[i].describe(tp)}: node {node[:12]}, GPU {','.join(ids)}"
                for i, (node, ids) in sorted(self.bundle_gpus.items())]

    def release(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.placement_group is not None and ray.is_initialized():
            try:
                remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001 - the cluster may be gone already: nothing is left to release
                pass
        self.placement_group = None


def cluster_node_gpus() -> tuple[int, ...]:
    """The GPUs of each live node of the Ray cluster, the driver's node first (node 0 of a plan)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: (n["NodeID"] != here, n["NodeID"]))
    return tuple(int(n.get("Resources", {}).get("GPU", 0)) for n in nodes)


def _bundle_gpus() -> tuple[str, tuple[str, ...]]:
    import ray

    return ray.get_runtime_context().get_node_id(), tuple(str(i) for i in ray.get_gpu_ids())


def _amount(value: float) -> str:
    return f"{value:g}"


def shortage(bundles: list[Bundle], wait_s: Optional[float]) -> str:
    """One line: what the group asks, what the cluster has (and has free), what is missing."""
    import ray

    asked = requested(bundles)
    total, free = ray.cluster_resources(), ray.available_resources()
    try:
        from ray._private.state import available_resources_per_node

        free_gpus_per_node = [r.get("GPU", 0.0) for r in available_resources_per_node().values()]
    except Exception:  # noqa: BLE001 - a private API: without it the line leaves out the per-node figure
        free_gpus_per_node = []
    widest = max((b.gpus for b in bundles), default=0)
    shown = [name for name in asked if not name.startswith("node:")]
    have = ", ".join(f"{_amount(total.get(n, 0))} {n} ({_amount(free.get(n, 0))} free)" for n in shown)
    missing = [f"{_amount(asked[n] - free.get(n, 0))} {n}" for n in shown if asked[n] > free.get(n, 0) + 1e-9]
    if not missing and widest and free_gpus_per_node and max(free_gpus_per_node) < widest:
        missing = [f"a node with {widest} free GPUs (most free on one node: {_amount(max(free_gpus_per_node))})"]
    when = f"within placement.wait_s={wait_s:g} s" if wait_s is not None else "at all"
    return (f"the Ray cluster cannot hold this run's placement group {when}: it asks for "
            + ", ".join(f"{_amount(asked[n])} {n}" for n in shown)
            + (f" (bundles of up to {widest} GPUs on one node)" if widest > 1 else "")
            + f"; the cluster has {have or 'nothing'}; missing {' and '.join(missing) or 'nothing free enough'}; "
            + ("add a node (`ray start --address ...`) or plan for fewer (learner.num_ranks, rollout.num_workers, "
               "env.num_servers)" if wait_s is None else
               "wait for the jobs holding them (`ray status`), add a node (`ray start --address ...`), or plan for "
               "fewer (learner.num_ranks, rollout.num_workers, env.num_servers)"))


def reserve(plan: PlacementPlan, cfg, wait_s: Optional[float] = None,
            log: Callable[[str], None] = lambda line: None) -> Reservation:
    """Reserve ``plan``'s bundles as one placement group (Ray must be initialised) and make the roles'
    slots; :class:`UsageError` (one line, the group removed) when the cluster cannot hold it within
    ``wait_s`` (default ``placement.wait_s``)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    wait_s = cfg.placement.wait_s if wait_s is None else wait_s
    bundles = plan_bundles(plan, cfg, f"node:{ray.util.get_node_ip_address()}")
    asked, total = requested(bundles), ray.cluster_resources()
    if any(amount > total.get(name, 0.0) + 1e-9 for name, amount in asked.items()):
        raise UsageError(shortage(bundles, None))
    group = placement_group([b.resources for b in bundles], strategy="PACK")
    if not group.wait(timeout_seconds=wait_s):
        line = shortage(bundles, wait_s)
        remove_placement_group(group)
        raise UsageError(line)
    probe = ray.remote(_bundle_gpus)
    gpu_bundles = [i for i, b in enumerate(bundles) if b.gpus]
    answers = ray.get([probe.options(num_cpus=0, num_gpus=bundles[i].gpus,
                                     scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote()
                       for i in gpu_bundles], timeout=max(60.0, wait_s))
    reservation = Reservation(group, bundles, colocated=plan.layout == "colocated",
                              bundle_gpus=dict(zip(gpu_bundles, answers)))
    tp = plan.tensor_parallel_size
    for i, bundle in enumerate(bundles):
        node, ids = reservation.bundle_gpus.get(i, ("", ()))
        if bundle.role == "driver":
            reservation.driver_gpu, reservation.driver_node = ids[0], node
        elif bundle.role == "learner":
            reservation.learner_slots.append(ActorSlot(group, i, ROLE_CPUS, 1, node_id=node))
        elif bundle.role == "rollout":
            reservation.rollout_slots.append(ActorSlot(group, i, ROLE_CPUS, tp, node_id=node))
        elif bundle.role == "colocated":
            reservation.rollout_slots.append(ActorSlot(group, i, ROLE_CPUS, 0, visible_devices=ids, node_id=node))
            if plan.learner_in_driver:
                reservation.driver_gpu, reservation.driver_node = ids[0], node
            else:
                reservation.learner_slots += [ActorSlot(group, i, ROLE_CPUS, 1, node_id=node) for _ in range(tp)]
        else:
            reservation.env_slots.append(ActorSlot(group, i, ROLE_CPUS, 0, node_id=node))
    for line in reservation.describe(tp):
        log(f"placement: {line}")
    planned = {e.node for e in plan.engines} | {r.node for r in plan.ranks}
    actual = {node for node, _ in reservation.bundle_gpus.values()}
    if len(actual) != len(planned):
        log(f"placement: Ray put the GPU bundles on {len(actual)} node(s) where the plan has {len(planned)} (a node "
            "short of CPUs for its bundles, or a placement.* pin); the lines above say where each went")
    return reservation


def reserve_for_run(cfg, log: Callable[[str], None] = print) -> Reservation:
    """``agentrl train`` on GPUs, before anything else starts: Ray started (or joined), the plan made
    on its nodes (:class:`~agentrl.placement.plan.InfeasiblePlan` when it does not fit), its group
    reserved, and a one-rank learner in this process pointed at the GPU reserved for it
    (``LOCAL_RANK``, which the learner's process group takes its device from)."""
    start_ray(cfg)
    plan = plan_placement(cfg, node_gpus=cluster_node_gpus())
    log(f"placement: {plan.layout} layout, {plan.gpus_used} GPUs of {describe_cluster(plan.node_gpus)}")
    reservation = reserve(plan, cfg, log=log)
    device = reservation.driver_device_index()
    if device is not None:
        os.environ["LOCAL_RANK"] = str(device)
    return reservation


__all__ = ["Bundle", "ROLE_CPUS", "Reservation", "cluster_node_gpus", "plan_bundles", "requested", "reserve",
           "reserve_for_run", "shortage"]
