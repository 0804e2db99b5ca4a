"""`agentrl` commands in a subprocess for the evaluation tests, and their tiny settings."""

from __future__ import annotations

import os
import subprocess
import sys

from cli_train import TINY

RECIPE = "textcraft_grpo_tiny"


def cli_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for an `agentrl` command, ``extra_env`` on top (e.g. the session's
    shared Ray head, tests/conftest.py::ray_head)."""
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})}


def run_cli(args: list[str], timeout: float = 600, extra_env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli.main", *args], env=cli_env(extra_env), timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def popen_cli(args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", *args], env=cli_env(extra_env), text=True,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


__all__ = ["RECIPE", "TINY", "cli_env", "popen_cli", "run_cli"]
