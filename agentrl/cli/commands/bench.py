"""``agentrl bench TARGET``: speed benchmarks (numbers for docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import pkgutil

import agentrl.bench as bench_pkg
from agentrl.bench._common import add_target_arguments, target_name

HELP = "run a benchmark (estimators, envs, rollout, ...) and print its numbers"
TORCH_COMPUTE = True    # see agentrl.cli.main


def _target_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(bench_pkg.__path__) if not m.name.startswith("_"))


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="bench_target", metavar="TARGET", required=True)
    for module_name in _target_modules():
        module = importlib.import_module(f"{bench_pkg.__name__}.{module_name}")
        p = sub.add_parser(target_name(module), help=module.HELP, description=module.HELP)
        add_target_arguments(p, module)
        p.set_defaults(_bench_run=module.run)


def run(args) -> int:
    return int(args._bench_run(args) or 0)
