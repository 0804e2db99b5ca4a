"""``agentrl plan recipe=NAME placement.nodes=N placement.gpus_per_node=G [--json] [--reserve]``: the
placement plan of a recipe on a cluster, with per-GPU memory estimates; no GPU needed."""

from __future__ import annotations

import argparse
import json

from agentrl.cli.commands._common import split_late_flags
from agentrl.config import load_config, parse_overrides

HELP = "print where a recipe's learner ranks, rollout engines and env servers go on N nodes x G GPUs"
DESCRIPTION = ("Plan a recipe's placement on placement.nodes x placement.gpus_per_node GPUs (placement.layout: "
               "split, colocated or auto) and print, per node and GPU, the roles and the estimated memory, the "
               "unused GPUs and the Ray placement group's bundles; a plan that cannot work is refused in one line. "
               "No GPU or Ray is needed. --reserve plans on the Ray cluster instead (RAY_ADDRESS, or a local one), "
               "reserves the placement group within placement.wait_s, and reports where a stand-in actor of each "
               "role runs and which GPUs it sees.")


def _add_flags(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--reserve", action="store_true",
                        help="plan on the Ray cluster, reserve the placement group and report each slot's node and GPUs")


def add_arguments(parser) -> None:
    # REMAINDER: key=value arguments and flags may come in any order (flags after them are parsed in run)
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="recipe=NAME|key=value",
                        help="a recipe (see `agentrl recipes`) and config overrides, placement.nodes and "
                             "placement.gpus_per_node among them")
    _add_flags(parser)


def run(args) -> int:
    from agentrl.placement import plan_placement
    from agentrl.placement.report import plan_dict, plan_text

    recipe, overrides = parse_overrides(split_late_flags(args, "agentrl plan", _add_flags))
    cfg = load_config(recipe, overrides)
    if not args.reserve:
        plan = plan_placement(cfg)
        print(json.dumps(plan_dict(plan, cfg, recipe), indent=2) if args.json else plan_text(plan, cfg, recipe))
        return 0
    from agentrl.placement.check import probe_slots
    from agentrl.placement.reservation import cluster_node_gpus, reserve
    from agentrl.runtime.ray_start import start_ray

    start_ray(cfg)
    plan = plan_placement(cfg, node_gpus=cluster_node_gpus())
    reservation = reserve(plan, cfg)
    try:
        reports = probe_slots(reservation)
    finally:
        reservation.release()
    if args.json:
        data = plan_dict(plan, cfg, recipe)
        data["slots"] = [{"role": r.role, "index": r.index, "node_id": r.node_id,
                          "cuda_visible_devices": r.visible_devices} for r in reports]
        data["driver_gpu"] = ({"node_id": reservation.driver_node, "gpu": reservation.driver_gpu}
                              if reservation.driver_gpu is not None else None)
        print(json.dumps(data, indent=2))
    else:
        print(plan_text(plan, cfg, recipe))
        print("reserved and checked on the Ray cluster (stand-in actors in each slot):")
        if reservation.driver_gpu is not None:
            print(f"  learner rank 0 (the driver's): node {reservation.driver_node[:12]}, GPU {reservation.driver_gpu}")
        print("\n".join(f"  {r.line()}" for r in reports))
    return 0
