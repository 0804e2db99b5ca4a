"""``agentrl config recipe=NAME [key=value ...]``: print the resolved configuration as YAML."""

from __future__ import annotations

import dataclasses
import typing

from agentrl.config import Config, config_to_yaml, load_config, parse_overrides

HELP = "print the resolved configuration of a recipe with overrides, as YAML"
DESCRIPTION = ("Resolve recipe=NAME (or the defaults) with key=value overrides, validate it, and print it "
               "as YAML. --keys lists every key with its default and help text.")


def add_arguments(parser) -> None:
    parser.add_argument("args", nargs="*", metavar="recipe=NAME|key=value", help="recipe and overrides")
    parser.add_argument("--keys", action="store_true", help="list every config key with its help text")


def _key_lines(cls: type, prefix: str = "") -> list[str]:
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        typ = hints[f.name]
        if dataclasses.is_dataclass(typ):
            lines.extend(_key_lines(typ, f"{prefix}{f.name}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        choices = f.metadata.get("choices")
        accepted = f" [{'|'.join(map(str, choices))}]" if choices else ""
        lines.append(f"{prefix}{f.name} = {default!r}{accepted}  # {f.metadata.get('help', '')}")
    return lines


def run(args) -> int:
    if args.keys:
        print("\n".join(_key_lines(Config)))
        return 0
    recipe, overrides = parse_overrides(args.args)
    cfg = load_config(recipe, overrides)
    print(config_to_yaml(cfg), end="")
    return 0
