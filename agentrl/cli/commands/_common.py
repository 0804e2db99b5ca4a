"""Helpers shared by the commands that take ``recipe=NAME key=value ...`` arguments."""

from __future__ import annotations

import argparse
from typing import Callable

from agentrl.config import Config, load_config, parse_overrides
from agentrl.errors import UsageError

# The recipe `agentrl train` runs when none is given: the best tiny CPU recipe.
DEFAULT_TRAIN_RECIPE = "textcraft_grpo_tiny"


def add_recipe_arguments(parser) -> None:
    parser.add_argument("args", nargs="*", metavar="recipe=NAME|key=value",
                        help="a recipe (see `agentrl recipes`) and config overrides (see `agentrl config --keys`)")


def resolve(args, default_recipe: str | None = None) -> tuple[str | None, Config]:
    recipe, overrides = parse_overrides(args.args)
    recipe = recipe or default_recipe
    return recipe, load_config(recipe, overrides)


def require_inputs(cfg: Config) -> None:
    """Stop before anything is written when a path the config names is missing or unusable."""
    from pathlib import Path

    name = cfg.model.name_or_path
    if name != "tiny" and name.startswith(("/", ".", "~")) and not Path(name).expanduser().is_dir():
        raise UsageError(f"model.name_or_path={name!r}: no such directory; pass `tiny`, a local Hugging Face "
                         "model directory, or a hub name such as Qwen/Qwen2.5-7B-Instruct")
    init = cfg.trainer.init_checkpoint
    if init and not (Path(init).expanduser() / "config.json").is_file():
        raise UsageError(f"trainer.init_checkpoint={init!r} is not a model directory (no config.json); pass a "
                         "directory written by `agentrl export` or `agentrl sft`, or leave it unset")
    out = Path(cfg.trainer.output_dir).expanduser()
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"trainer.output_dir={cfg.trainer.output_dir!r} cannot be created: {existing} is a "
                         "file; set trainer.output_dir to a writable directory")


def require_agent(cfg: Config) -> None:
    """Stop before anything starts when ``rollout.agent`` cannot be loaded here (the rollout workers load
    it again where they run): no colon, a module that does not import, a missing or non-callable name."""
    if cfg.rollout.agent:
        from agentrl.rollout.agents.task import load_agent

        load_agent(cfg.rollout.agent)


def wants_gpu(cfg: Config) -> bool:
    """Whether the run trains on GPUs: ``trainer.device=cuda``, or ``auto`` with a model that is not tiny."""
    return cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and cfg.model.name_or_path != "tiny")


def require_hardware(cfg: Config, recipe: str | None) -> None:
    """Stop before anything is written when a GPU recipe meets a machine without GPUs."""
    import torch

    if wants_gpu(cfg) and not torch.cuda.is_available():
        raise UsageError(f"{recipe or 'this config'} trains {cfg.model.name_or_path} and needs GPUs, but none is "
                         "visible; run a *_tiny recipe on CPU, or pass trainer.device=cpu to force the CPU")


def require_placement(cfg: Config) -> None:
    """Stop before anything is written when a GPU run's placement plan cannot work on the cluster that
    ``placement.nodes`` x ``placement.gpus_per_node`` describe (when both are set; the trainer plans
    on the Ray cluster's own nodes again before any actor starts)."""
    if wants_gpu(cfg) and cfg.placement.nodes and cfg.placement.gpus_per_node:
        from agentrl.placement import plan_placement

        plan_placement(cfg)


def split_late_flags(args, prog: str, add_flags: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    """Apply flags that came after ``key=value`` arguments (argparse.REMAINDER keeps them) to ``args``;
    return the remaining ``key=value`` items."""
    flags = argparse.ArgumentParser(prog=prog, add_help=False, exit_on_error=False)
    add_flags(flags)
    try:
        late, items = flags.parse_known_args(args.args)
    except argparse.ArgumentError as err:
        raise UsageError(str(err)) from None
    for key, value in vars(late).items():
        if value != flags.get_default(key):
            setattr(args, key, value)
    return items
