"""The rollout tests' ALFWorld games (the tiny model and its tokenizer are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def alfworld_games_dir(tmp_path_factory) -> str:
    """Two ALFWorld games of ``valid_seen`` in the official layout (a few seconds), so rollout tests
    do not wait for the first-use set of 216 games. Use as ``data_dir`` or ``ALFWORLD_DATA``."""
    from agentrl_env_alfworld.generate import generate_dataset

    out = str(tmp_path_factory.mktemp("alfworld-games"))
    generate_dataset(out, {"valid_seen": 2}, seed=0, workers=2)
    return out
