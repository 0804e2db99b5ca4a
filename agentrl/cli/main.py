"""Entry point of the ``agentrl`` console script."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

from agentrl import __version__
from agentrl.errors import UsageError
import agentrl.cli.commands as commands_pkg

# Order in which commands appear in --help; commands not listed here follow alphabetically.
COMMAND_ORDER = ("train", "plan", "sft", "eval", "inspect", "sweep", "table", "recipes", "config", "envs", "bench", "checklist", "export")


def discover_commands() -> dict[str, ModuleType]:
    names = sorted(m.name for m in pkgutil.iter_modules(commands_pkg.__path__) if not m.name.startswith("_"))
    rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
    names.sort(key=lambda n: (rank.get(n.replace("_", "-"), len(rank)), n))
    return {n.replace("_", "-"): importlib.import_module(f"{commands_pkg.__name__}.{n}") for n in names}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, usage hint
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The full parser; only the ``selected`` command's arguments are built (its module may import
    heavy packages), so ``agentrl --help`` and every command start fast."""
    parser = _Parser(
        prog="agentrl",
        description="Reinforcement learning for multi-turn LLM agents with group-based advantage estimators "
        "(`agentrl config --keys` lists them under algorithm.estimator) on ALFWorld, WebShop and TextCraft.",
        epilog="Configuration: `recipe=NAME` picks a recipe (see `agentrl recipes`); any further "
        "`key=value` argument overrides one config field, e.g. `learner.lr=2e-6`.",
    )
    parser.add_argument("--version", action="version", version=f"agentrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in discover_commands().items():
        p = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP))
        if selected is None or name == selected:
            module.add_arguments(p)
        # a command module that computes with torch says TORCH_COMPUTE = True: main flushes denormal
        # floats before it runs, while torch has no threads yet (agentrl.runtime.denormals)
        p.set_defaults(_run=module.run, _flush_denormals=getattr(module, "TORCH_COMPUTE", False))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        command = next((a for a in argv if not a.startswith("-")), None)
        parser = build_parser(selected=command or "")
        args = parser.parse_args(argv)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        if args._flush_denormals:
            from agentrl.runtime.denormals import flush_denormals    # imports torch: only the commands that compute

            flush_denormals()
        return int(args._run(args) or 0)
    except UsageError as err:
        print(f"agentrl: error: {err}", file=sys.stderr)
        return UsageError.exit_code
    except BrokenPipeError:  # e.g. `agentrl recipes | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("agentrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
