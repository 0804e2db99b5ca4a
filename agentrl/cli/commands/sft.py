"""``agentrl sft recipe=NAME [key=value ...]``: supervised warm start on expert demonstrations only."""

from __future__ import annotations

import json

from agentrl.cli.commands._common import DEFAULT_TRAIN_RECIPE, add_recipe_arguments, resolve

HELP = "supervised warm start on the environment's expert demonstrations (writes <run>/sft_model)"
TORCH_COMPUTE = True    # see agentrl.cli.main


def add_arguments(parser) -> None:
    add_recipe_arguments(parser)


def run(args) -> int:
    recipe, cfg = resolve(args, DEFAULT_TRAIN_RECIPE)
    from agentrl.warmstart.starting_policy import initial_model
    from agentrl.runs.directory import RunDirectory
    from agentrl.warmstart.sft import run_sft
    from agentrl.runs.tracking import Tracker

    run_dir = RunDirectory.create(cfg, recipe)
    tracker = Tracker(run_dir.path, cfg.logging, run_dir.name)
    try:
        start = cfg.trainer.init_checkpoint or initial_model(cfg, run_dir, tracker.status)
        summary = run_sft(cfg, start, run_dir.path / "sft_model", log=lambda m: tracker.log(m, step=0),
                          status=tracker.status)
    finally:
        tracker.close()
    print(json.dumps({"sft_model": str(run_dir.path / "sft_model"), **summary}, indent=2))
    return 0
