"""``agentrl envs ...``: environment servers and per-environment tools.

Subcommands are contributed by the environment packages: a module ``agentrl.envs.<name>.cli``
that defines ``add_cli(subparsers)`` adds its own subcommands (e.g. ``agentrl envs alfworld
generate``); ``agentrl.envs.server.cli`` adds ``serve``.
"""

from __future__ import annotations

import importlib

from agentrl.envs import ENV_NAMES

HELP = "serve environments over HTTP and run environment tools"

_CLI_MODULES = ("agentrl.envs.server.cli",) + tuple(f"agentrl.envs.{n}.cli" for n in ENV_NAMES)


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="envs_command", metavar="SUBCOMMAND", required=True)
    for module_name in _CLI_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                continue  # that environment ships no CLI
            raise
        module.add_cli(sub)


def run(args) -> int:
    return int(args._envs_run(args) or 0)
