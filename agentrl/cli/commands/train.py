"""``agentrl train [recipe=NAME] [key=value ...]``: SFT warm start (tiny recipes) and RL training."""

from __future__ import annotations

import json

from agentrl.cli.commands._common import (DEFAULT_TRAIN_RECIPE, add_recipe_arguments, require_agent,
                                          require_hardware, require_inputs, require_placement, resolve)

HELP = f"train a policy with RL (default recipe: {DEFAULT_TRAIN_RECIPE}, a tiny CPU recipe)"
TORCH_COMPUTE = True    # see agentrl.cli.main
DESCRIPTION = (f"Train with the recipe's estimator. Without recipe=NAME this runs {DEFAULT_TRAIN_RECIPE} on CPU: "
               "tokenizer and tiny model built from the environment's text, SFT warm start on expert "
               "demonstrations, then RL with periodic validation. trainer.resume=auto (the default) continues a "
               "killed run from its newest checkpoint.")


def add_arguments(parser) -> None:
    add_recipe_arguments(parser)


def run(args) -> int:
    recipe, cfg = resolve(args, DEFAULT_TRAIN_RECIPE)
    require_inputs(cfg)
    require_agent(cfg)
    require_placement(cfg)
    require_hardware(cfg, recipe)
    from agentrl.training.trainer import train

    summary = train(cfg, recipe)
    print(json.dumps(summary, indent=2))
    return 0
