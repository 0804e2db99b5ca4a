"""The placement plan as text (per node, per GPU: roles and memory) or as a JSON-ready dictionary."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from agentrl.generation import planned_backend
from agentrl.placement.plan import GpuPlan, PlacementPlan, describe_cluster
from agentrl.placement.reservation import Bundle, plan_bundles, requested

DRIVER_NODE = "node:<driver>"     # stands for the driver node's resource in a plan shown without Ray


def gpu_roles(gpu: GpuPlan, plan: PlacementPlan) -> str:
    parts = []
    for use in gpu.uses:
        if use.role == "learner":
            parts.append(f"learner rank {use.index}" + (" (in the driver)" if plan.learner_in_driver else ""))
        else:
            parts.append(f"rollout engine {use.index} [{use.part + 1}/{plan.tensor_parallel_size}]")
    return " + ".join(parts)


def _ranges(indices: list[int]) -> str:
    """``0-3, 6``."""
    out, start = [], None
    for i, value in enumerate(indices):
        if start is None:
            start = value
        if i + 1 == len(indices) or indices[i + 1] != value + 1:
            out.append(f"{start}-{value}" if value != start else f"{value}")
            start = None
    return ", ".join(out)


def _resources_text(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in resources.items()) + "}"


def bundle_lines(bundles: list[Bundle]) -> list[str]:
    names = {"learner": "learner rank", "rollout": "rollout engine", "colocated": "rollout engine + its learner ranks",
             "driver": "GPU of the driver's learner", "env": "env server"}
    counts = Counter((b.role, _resources_text(b.resources)) for b in bundles)
    return [f"{count} x {resources} {names[role]}{'s' if count > 1 and role in ('learner', 'rollout', 'env') else ''}"
            for (role, resources), count in counts.items()]


def plan_text(plan: PlacementPlan, cfg, recipe: Optional[str] = None) -> str:
    total = sum(plan.node_gpus)
    lines = [f"{recipe or 'this config'} on {describe_cluster(plan.node_gpus)} of {plan.gpu_memory_gb:g} GB: "
             f"{plan.layout} layout, {plan.gpus_used} of {total} GPUs used"]
    size = f", {plan.parameters / 1e9:.2f} B parameters" if plan.parameters else ""
    learner = ("1 rank in the driver process" if plan.learner_in_driver else
               f"{len(plan.ranks)} Ray ranks") + f", ZeRO-{plan.zero_stage}"
    backend = planned_backend(cfg.rollout).title or planned_backend(cfg.rollout).name
    lines.append(f"model {plan.model}{size}; learner {learner}; rollout {len(plan.engines)} {backend} engine(s) x "
                 f"{plan.tensor_parallel_size} GPU(s)")
    for node, count in enumerate(plan.node_gpus):
        gpus = [g for g in plan.gpus if g.node == node]
        driver = " (runs agentrl train)" if node == 0 else ""
        if not any(g.uses for g in gpus):
            lines.append(f"node {node}{driver}: {count} GPUs unused" if count else f"node {node}{driver}: no GPU")
            continue
        lines.append(f"node {node}{driver}")
        for gpu in gpus:
            if gpu.uses:
                memory = f"{gpu.memory_gb:6.1f} GB" if gpu.memory_gb is not None else "      ? GB"
                lines.append(f"  GPU {gpu.gpu:<2} {gpu_roles(gpu, plan):<42} {memory}")
        unused = [g.gpu for g in gpus if not g.uses]
        if unused:
            lines.append(f"  GPU {_ranges(unused)} unused")
    if plan.learner is not None:
        lines.append("per-GPU estimates (GB of 10^9 bytes, records at the config's length bounds):")
        described = set()
        for gpu in plan.gpus:
            kind = tuple(sorted({use.role for use in gpu.uses}))
            if gpu.uses and kind not in described:
                described.add(kind)
                name = {("learner",): "learner rank", ("rollout",): "engine GPU",
                        ("learner", "rollout"): "shared GPU"}[kind]
                lines.append(f"  {name}: {gpu.memory_text}")
        busiest = max(g.memory_gb for g in plan.gpus if g.memory_gb is not None)
        lines.append(f"  busiest GPU {busiest:.1f} of {plan.gpu_memory_gb:g} GB (placement.gpu_memory_gb)")
    servers = plan.env_servers
    lines.append(f"env servers: {servers} (1 CPU each, on whichever nodes have CPUs free)" if servers else
                 "env servers: none started (env.server_url)")
    bundles = plan_bundles(plan, cfg, DRIVER_NODE)
    asked = requested(bundles)
    lines.append("Ray placement group (one, all bundles at once): " + "; ".join(bundle_lines(bundles))
                 + f" = {asked.get('GPU', 0):g} GPUs, {asked.get('CPU', 0):g} CPUs")
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)


def plan_dict(plan: PlacementPlan, cfg, recipe: Optional[str] = None) -> dict[str, Any]:
    data = {"recipe": recipe, **plan.as_dict()}
    data["bundles"] = [{"role": b.role, "index": b.index, "resources": b.resources}
                       for b in plan_bundles(plan, cfg, DRIVER_NODE)]
    return data


__all__ = ["plan_dict", "plan_text"]
