"""Shared pieces of the evaluation tests: tiny settings and a tiny starting policy (hidden 64)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128",
        "model.tiny.num_heads=4", "model.tiny.num_kv_heads=2", "tokenizer.vocab_size=600", "tokenizer.corpus_tasks=40"]
RECIPE = "textcraft_grpo_tiny"


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> str:
    """A tiny random TextCraft policy as a Hugging Face directory (tokenizer trained on env text)."""
    from agentrl.config import load_config
    from agentrl.models import prepare_initial_model
    from agentrl.warmstart.starting_policy import corpus_builder

    cfg = load_config(RECIPE, TINY)
    out = tmp_path_factory.mktemp("policy") / "init"
    return prepare_initial_model(cfg.model, cfg.tokenizer, out, corpus=corpus_builder(cfg), seed=0)


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
