"""Typed configuration, recipes and command-line overrides."""

from agentrl.config.loading import (
    RECIPES_DIR, config_to_dict, config_to_yaml, load_config, parse_overrides, recipe_description, recipe_names,
)
from agentrl.config.schema import Config

__all__ = ["Config", "RECIPES_DIR", "config_to_dict", "config_to_yaml", "load_config", "parse_overrides",
           "recipe_description", "recipe_names"]
