"""The configuration reference (docs/configuration.md), generated from the config dataclasses.

``python -m agentrl.config.reference > docs/configuration.md`` rewrites it; a test fails when the
committed file differs from what the dataclasses say.
"""

from __future__ import annotations

import dataclasses
import typing

from agentrl.config.schema import Config
from agentrl.estimators.params import describe


def _default(f: dataclasses.Field) -> object:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def _accepted(f: dataclasses.Field, typ: object) -> str:
    if "choices" in f.metadata:
        return " \\| ".join(f"`{c}`" for c in f.metadata["choices"])
    return describe(dict(f.metadata), typ)


def _section(cls: type, prefix: str, lines: list[str]) -> None:
    hints = typing.get_type_hints(cls)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            nested.append((f, hints[f.name]))
            continue
        rows.append(f"| `{prefix}{f.name}` | `{_default(f)!r}` | {_accepted(f, hints[f.name])} | {f.metadata['help']} |")
    if rows:
        lines += [f"## `{prefix.rstrip('.') or 'top level'}`", "", "| key | default | accepts | meaning |",
                  "|---|---|---|---|", *rows, ""]
    for f, typ in nested:
        _section(typ, f"{prefix}{f.name}.", lines)


def render() -> str:
    lines = ["# Configuration reference", "",
             "Generated from `agentrl/config/schema.py` and the estimators' `Params` (`agentrl/estimators/`) by",
             "`python -m agentrl.config.reference`; do not edit by hand.",
             "Recipes (`agentrl/recipes/`) override these defaults and `key=value` arguments override recipes, e.g.",
             "`agentrl train recipe=alfworld_gigpo_qwen1.5b learner.lr=2e-6 env.group_size=4`.", ""]
    _section(Config, "", lines)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
