"""The placement plan: which GPU of which node holds each learner rank and each rollout engine.

    plan = plan_placement(cfg, nodes=1, gpus_per_node=8)        # or node_gpus=(8, 8, 4)
    plan.layout                 # "split" or "colocated"
    plan.ranks, plan.engines    # RankPlan(rank, node, gpu), EnginePlan(index, node, gpus)
    plan.gpus                   # every GPU: its uses and its memory estimate

Two layouts:

* ``split``: each GPU holds one learner rank or one GPU of a rollout engine; ``learner.num_ranks +
  rollout.num_workers x E`` GPUs, E the GPUs of one engine as its back end declares them
  (``GenerationBackend.engine_gpus``: vLLM's ``rollout.vllm.tensor_parallel_size``, the torch engine's 1);
* ``colocated``: each GPU holds one learner rank and one GPU of an engine, which may sleep during the
  learner's passes (vLLM: ``rollout.vllm.sleep_level``); ``learner.num_ranks`` GPUs, which must equal
  ``rollout.num_workers x E``.

``placement.layout=auto`` takes split when it fits the GPUs and their memory, else colocated.

All GPUs of an engine are on one node. Engines are placed first (the largest pieces), each on the
first node with enough free GPUs, then learner ranks on the first free GPUs; on each node the
learner's GPUs are numbered first. A one-rank learner is not a Ray actor: it runs in the driver
process (``agentrl train``), so the plan puts it on node 0, the driver's node, GPU 0, and the Ray
placement group reserves that GPU for it (:mod:`agentrl.placement.reservation`). Env servers take
one CPU each, no GPU; the plan counts them and Ray places them.

A plan that cannot work raises :class:`InfeasiblePlan`, a UsageError of one line: what is missing,
then the fix. Memory estimates: :mod:`agentrl.placement.memory` and the back end's own
(``GenerationBackend.memory``, with its ``memory_problem`` check).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from agentrl.errors import UsageError
from agentrl.generation import EngineMemory, MemoryInputs, backend_settings, planned_backend, setting_key
from agentrl.placement.memory import (LearnerMemory, learner_memory, memory_inputs, model_shape, rollout_memory,
                                      shared_gpu_memory)

LAYOUTS = ("split", "colocated")


class InfeasiblePlan(UsageError):
    """The roles do not fit the cluster: ``reason`` says what is missing, ``fix`` what to change."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


@dataclass(frozen=True)
class GpuUse:
    role: str           # "learner" or "rollout"
    index: int          # the learner rank or the rollout engine
    part: int = 0       # which of the engine's GPUs (0 .. tensor_parallel_size - 1)


@dataclass
class GpuPlan:
    node: int
    gpu: int
    uses: list[GpuUse] = field(default_factory=list)
    memory_gb: Optional[float] = None       # the estimate of its busiest phase
    memory_text: str = ""                   # how that estimate adds up


@dataclass(frozen=True)
class RankPlan:
    rank: int
    node: int
    gpu: int


@dataclass(frozen=True)
class EnginePlan:
    index: int
    node: int
    gpus: tuple[int, ...]


@dataclass
class PlacementPlan:
    layout: str
    node_gpus: tuple[int, ...]
    gpu_memory_gb: float
    model: str
    parameters: Optional[int]
    learner_in_driver: bool
    zero_stage: int
    tensor_parallel_size: int
    env_servers: int
    ranks: list[RankPlan]
    engines: list[EnginePlan]
    gpus: list[GpuPlan]
    learner: Optional[LearnerMemory] = None
    rollout: Optional[EngineMemory] = None
    notes: list[str] = field(default_factory=list)

    @property
    def gpus_used(self) -> int:
        return sum(1 for gpu in self.gpus if gpu.uses)

    @property
    def unused(self) -> list[GpuPlan]:
        return [gpu for gpu in self.gpus if not gpu.uses]

    def gpu(self, node: int, index: int) -> GpuPlan:
        return next(g for g in self.gpus if g.node == node and g.gpu == index)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus_used"], data["gpus_unused"] = self.gpus_used, len(self.unused)
        return data


def describe_cluster(node_gpus: Sequence[int]) -> str:
    """``1 node x 8 GPUs``, ``4 nodes x 8 GPUs`` or ``3 nodes (8, 8, 4 GPUs)``."""
    count = len(node_gpus)
    nodes = f"{count} node{'s' if count != 1 else ''}"
    if len(set(node_gpus)) <= 1:
        return f"{nodes} x {node_gpus[0] if node_gpus else 0} GPUs"
    return f"{nodes} ({', '.join(map(str, node_gpus))} GPUs)"


def cluster_shape(cfg, nodes: Optional[int] = None, gpus_per_node: Optional[int] = None,
                  node_gpus: Optional[Sequence[int]] = None) -> tuple[int, ...]:
    """The GPUs of each node: ``node_gpus`` as given (the Ray cluster's, the driver's node first), else
    ``nodes`` x ``gpus_per_node`` (default ``placement.nodes`` x ``placement.gpus_per_node``)."""
    if node_gpus is not None:
        return tuple(int(n) for n in node_gpus)
    nodes = cfg.placement.nodes if nodes is None else nodes
    gpus_per_node = cfg.placement.gpus_per_node if gpus_per_node is None else gpus_per_node
    if nodes < 1 or gpus_per_node < 1:
        raise UsageError("a placement plan needs the cluster's shape: pass placement.nodes=N and "
                         "placement.gpus_per_node=G (e.g. placement.nodes=1 placement.gpus_per_node=8)")
    return (int(gpus_per_node),) * int(nodes)


def plan_placement(cfg, nodes: Optional[int] = None, gpus_per_node: Optional[int] = None, *,
                   node_gpus: Optional[Sequence[int]] = None, layout: Optional[str] = None) -> PlacementPlan:
    """The plan of ``cfg``'s roles on the cluster (see the module's docstring); raises
    :class:`InfeasiblePlan` when they do not fit."""
    shape = cluster_shape(cfg, nodes, gpus_per_node, node_gpus)
    layout = layout or cfg.placement.layout
    if layout != "auto":
        return _plan(cfg, shape, layout)
    try:
        return _plan(cfg, shape, "split")
    except InfeasiblePlan as split:
        try:
            plan = _plan(cfg, shape, "colocated")
        except InfeasiblePlan as colocated:
            raise InfeasiblePlan(f"neither layout fits: split: {split.reason}; colocated: {colocated.reason}",
                                 split.fix) from None
        plan.notes.insert(0, f"placement.layout=auto chose colocated: split does not fit ({split.reason})")
        return plan


def engine_gpus_key(cfg) -> Optional[str]:
    """The config key that sets the GPUs of one rollout engine (None: its back end fixes them)."""
    backend = planned_backend(cfg.rollout)
    return setting_key(backend, backend.engine_gpus_setting)


def _plan(cfg, node_gpus: tuple[int, ...], layout: str) -> PlacementPlan:
    ranks, workers = cfg.learner.num_ranks, cfg.rollout.num_workers
    backend = planned_backend(cfg.rollout)
    tp, tp_key = backend.engine_gpus(backend_settings(cfg.rollout, backend)), engine_gpus_key(cfg)
    total, widest = sum(node_gpus), max(node_gpus, default=0)
    where = describe_cluster(node_gpus)
    if tp > widest:
        engine = f"{tp_key}={tp}" if tp_key else f"rollout.backend={cfg.rollout.backend}"
        raise InfeasiblePlan(f"a rollout engine of {engine} needs {tp} GPUs on one "
                             f"node and the nodes have at most {widest} ({where})",
                             f"set {tp_key} to {widest} or less (and rollout.num_workers up to keep the GPUs busy)"
                             if tp_key else "add GPUs to a node or choose another rollout.backend")
    in_driver = ranks == 1
    if in_driver and node_gpus[0] < 1:
        raise InfeasiblePlan("learner.num_ranks=1 runs the learner in the agentrl process, on node 0 (the "
                             "driver's), which has no GPU", "run agentrl train on a GPU node, or set "
                             "learner.num_ranks to 2 or more (Ray actors)")
    free = [list(range(n)) for n in node_gpus]
    if layout == "split":
        needed = ranks + workers * tp
        if needed > total:
            raise InfeasiblePlan(f"the split layout needs {needed} GPUs ({ranks} learner rank(s) + {workers} rollout "
                                 f"engine(s) x {tp}) and the cluster has {total} ({where})",
                                 "add GPUs (placement.nodes), lower learner.num_ranks or rollout.num_workers, or set "
                                 "placement.layout=colocated")
        driver_gpu = free[0].pop(0) if in_driver else None
        engines = _place_engines(free, workers, tp, tp_key)
        rank_plans = ([RankPlan(0, 0, driver_gpu)] if in_driver else
                      [RankPlan(r, node, gpu) for r, (node, gpu) in enumerate(_take_single_gpus(free, ranks))])
        rank_plans, engines = _number_learner_first(rank_plans, engines)
    elif layout == "colocated":
        if ranks != workers * tp:
            suggestion = (f"rollout.num_workers={ranks // tp}" if ranks % tp == 0 else
                          f"learner.num_ranks={workers * tp}")
            raise InfeasiblePlan(f"the colocated layout puts one learner rank on each GPU of each rollout engine, so "
                                 f"learner.num_ranks must equal rollout.num_workers x "
                                 f"{tp_key or 'the GPUs of one engine'} ({ranks} != {workers} x {tp})",
                                 f"set {suggestion}, or placement.layout=split")
        if ranks > total:
            raise InfeasiblePlan(f"the colocated layout needs {ranks} GPUs (one per learner rank) and the cluster has "
                                 f"{total} ({where})", "add GPUs (placement.nodes) or lower learner.num_ranks and "
                                 "rollout.num_workers")
        if in_driver:
            free[0].pop(0)
            engines = [EnginePlan(0, 0, (0,))]
        else:
            engines = _place_engines(free, workers, tp, tp_key)
        rank_plans = [RankPlan(e.index * tp + j, e.node, gpu) for e in engines for j, gpu in enumerate(e.gpus)]
    else:
        raise UsageError(f"placement.layout={layout!r}: choose auto, split or colocated")
    gpus = [GpuPlan(node, gpu) for node, count in enumerate(node_gpus) for gpu in range(count)]
    index = {(g.node, g.gpu): g for g in gpus}
    for r in rank_plans:
        index[r.node, r.gpu].uses.append(GpuUse("learner", r.rank))
    for e in engines:
        for part, gpu in enumerate(e.gpus):
            index[e.node, gpu].uses.append(GpuUse("rollout", e.index, part))
    shape = model_shape(cfg)
    plan = PlacementPlan(layout=layout, node_gpus=node_gpus, gpu_memory_gb=cfg.placement.gpu_memory_gb,
                         model=cfg.model.name_or_path, parameters=shape.parameters() if shape else None,
                         learner_in_driver=in_driver, zero_stage=cfg.learner.zero_stage, tensor_parallel_size=tp,
                         env_servers=0 if cfg.env.server_url else cfg.env.num_servers,
                         ranks=sorted(rank_plans, key=lambda r: r.rank), engines=engines, gpus=gpus)
    if shape is None:
        plan.notes.append(f"memory not estimated: no architecture known for {cfg.model.name_or_path!r} (not a "
                          "built-in Qwen2.5 name, a local directory or a cached hub model)")
    else:
        _estimate_memory(cfg, plan, learner_memory(cfg, shape), rollout_memory(cfg, shape, cfg.placement.gpu_memory_gb),
                         memory_inputs(cfg, shape, cfg.placement.gpu_memory_gb))
    if plan.unused:
        plan.notes.append(f"{len(plan.unused)} of {total} GPUs unused: raise learner.num_ranks or "
                          "rollout.num_workers to use them")
    return plan


def _place_engines(free: list[list[int]], workers: int, tp: int, tp_key: Optional[str]) -> list[EnginePlan]:
    """Each engine on the first node with ``tp`` free GPUs (taken from ``free``)."""
    engines = []
    for e in range(workers):
        node = next((n for n, gpus in enumerate(free) if len(gpus) >= tp), None)
        if node is None:
            left = ", ".join(str(len(gpus)) for gpus in free)
            raise InfeasiblePlan(f"rollout engine {e} needs {tp} free GPUs on one node and no node has them "
                                 f"(free GPUs per node: {left})",
                                 f"lower {tp_key + ' or ' if tp_key else ''}rollout.num_workers, or add nodes")
        engines.append(EnginePlan(e, node, tuple(free[node][:tp])))
        del free[node][:tp]
    return engines


def _take_single_gpus(free: list[list[int]], count: int) -> list[tuple[int, int]]:
    taken = []
    for node, gpus in enumerate(free):
        while gpus and len(taken) < count:
            taken.append((node, gpus.pop(0)))
    return taken


def _number_learner_first(ranks: list[RankPlan], engines: list[EnginePlan]
                          ) -> tuple[list[RankPlan], list[EnginePlan]]:
    """Renumber each node's GPUs in use: the learner ranks' first (by rank), then the engines'."""
    renumbered: dict[tuple[int, int], int] = {}
    next_gpu: dict[int, int] = {}
    order = [(r.node, r.gpu) for r in sorted(ranks, key=lambda r: r.rank)]
    order += [(e.node, gpu) for e in engines for gpu in e.gpus]
    for node, gpu in order:
        renumbered[node, gpu] = next_gpu.get(node, 0)
        next_gpu[node] = renumbered[node, gpu] + 1
    return ([RankPlan(r.rank, r.node, renumbered[r.node, r.gpu]) for r in ranks],
            [EnginePlan(e.index, e.node, tuple(renumbered[e.node, g] for g in e.gpus)) for e in engines])


def _estimate_memory(cfg, plan: PlacementPlan, learner: LearnerMemory, rollout: EngineMemory,
                     inputs: MemoryInputs) -> None:
    """Each GPU's estimate; :class:`InfeasiblePlan` when one does not fit ``placement.gpu_memory_gb``, or
    when the back end says its engine cannot start on what it gets (``GenerationBackend.memory_problem``)."""
    plan.learner, plan.rollout = learner, rollout
    limit, backend = plan.gpu_memory_gb, planned_backend(cfg.rollout)
    settings = backend_settings(cfg.rollout, backend)
    problem = backend.memory_problem(rollout, settings, inputs)
    if problem is not None:
        raise InfeasiblePlan(*problem)
    engine_text, engine = rollout.text, rollout.engine
    shared = shared_gpu_memory(cfg, learner, rollout)
    for gpu in plan.gpus:
        roles = {use.role for use in gpu.uses}
        if roles == {"learner", "rollout"}:
            gpu.memory_gb = shared.peak
            if shared.overlapped:
                gpu.memory_text = (f"learner {learner.peak:.1f} + {engine} {rollout.budget:.1f} at once "
                                   f"(trainer.mode={cfg.trainer.mode})")
            else:
                asleep = "asleep" if rollout.asleep < rollout.budget else "awake"
                gpu.memory_text = (f"rollout phase {shared.rollout_phase:.1f} (learner resident {learner.resident:.1f} "
                                   f"+ {engine} {rollout.budget:.1f}), learner phase {shared.learner_phase:.1f} "
                                   f"(learner {learner.peak:.1f} + {engine} {asleep} {rollout.asleep:.1f})")
        elif roles == {"learner"}:
            gpu.memory_gb, gpu.memory_text = learner.peak, learner.breakdown()
        elif roles == {"rollout"}:
            gpu.memory_gb, gpu.memory_text = rollout.budget, engine_text
    worst = max((g for g in plan.gpus if g.memory_gb is not None), key=lambda g: g.memory_gb, default=None)
    if worst is None or worst.memory_gb <= limit:
        return
    if plan.layout == "colocated":
        fixes = [*backend.memory_fixes(settings), "lower learner.micro_batch_size"]
        raise InfeasiblePlan(f"a GPU shared by a learner rank and a rollout engine needs an estimated "
                             f"{worst.memory_gb:.1f} GB ({worst.memory_text}), more than placement.gpu_memory_gb="
                             f"{limit:g}", f"{', '.join(fixes)}, or use placement.layout=split")
    raise InfeasiblePlan(f"a learner rank needs an estimated {worst.memory_gb:.1f} GB of its GPU ({worst.memory_text}), "
                         f"more than placement.gpu_memory_gb={limit:g}",
                         "lower learner.micro_batch_size, shard more (learner.zero_stage=3 over more "
                         "learner.num_ranks), set learner.offload_optimizer=true, or set placement.gpu_memory_gb to "
                         "your GPUs' memory")


__all__ = ["EnginePlan", "GpuPlan", "GpuUse", "InfeasiblePlan", "LAYOUTS", "PlacementPlan", "RankPlan",
           "cluster_shape", "describe_cluster", "plan_placement"]
