"""``agentrl bench envs`` through the HTTP pool server: it runs and reports steps per second."""

from __future__ import annotations

import json

import pytest

from agentrl.cli.main import main as cli_main

pytestmark = pytest.mark.slow


def test_bench_envs_http_reports_steps_per_second(capsys):
    assert cli_main(["bench", "envs", "--envs", "textcraft", "--no-ray", "--seconds", "0.3", "--tasks", "4",
                     "--pool-size", "4", "--shards", "2", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)["textcraft"]
    http = entry["http (4 envs, 2 processes)"]
    assert "error" not in http, http
    assert http["steps"] > 0 and http["steps_per_s"] > 0 and http["resets"] >= 4
    assert entry["in-process"]["steps_per_s"] > 0
