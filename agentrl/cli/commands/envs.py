"""``agentrl envs ...``: environment servers, the environments found, and per-environment tools.

``agentrl envs list`` lists the environments found (installed ``agentrl-env-<name>`` distributions
and a source checkout's ``envs/<name>/``, :mod:`agentrl.envs.spec`). Further subcommands are
contributed by the environment packages: a spec whose ``cli`` names a module that defines
``add_cli(subparsers)`` adds its own (e.g. ``agentrl envs alfworld generate``);
``agentrl.envs.server.cli`` adds ``serve``.
"""

from __future__ import annotations

import importlib
import sys

from agentrl.envs.spec import env_names, env_spec

HELP = "serve environments over HTTP, list the environments found, run environment tools"


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="envs_command", metavar="SUBCOMMAND", required=True)
    listing = sub.add_parser("list", help="list the environments found: name, package, description")
    listing.set_defaults(_envs_run=_list)
    modules = ["agentrl.envs.server.cli"] + [spec.cli for spec in map(env_spec, env_names()) if spec.cli]
    for module_name in modules:
        importlib.import_module(module_name).add_cli(sub)


def _list(args) -> int:
    for name in env_names():
        spec = env_spec(name)
        module = sys.modules.get(spec.make_env.__module__)
        where = getattr(module, "__file__", "") or spec.make_env.__module__
        splits = f"splits {', '.join(spec.splits)}; " if spec.splits else ""
        print(f"{name:12s} {spec.description or spec.title}\n{'':12s} {splits}{where}")
    return 0


def run(args) -> int:
    return int(args._envs_run(args) or 0)
