"""``agentrl bench hardening`` runs each attack against a fresh server and prints its figures (tiny
sizes; the attacks themselves are tests/reliability/test_adversarial_clients.py's)."""

import json

import pytest

from agentrl.cli.main import main as cli_main

pytestmark = pytest.mark.slow


def test_bench_hardening_reports_each_attack(capsys):
    assert cli_main(["bench", "hardening", "--json", "--attacks", "none,bodies", "--seconds", "0.5",
                     "--bodies", "2", "--baseline", "none"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["results"]) == {"none", "bodies"} and set(report["results"]["bodies"]) == {"new"}
    figures = report["results"]["bodies"]["new"]
    assert figures["answers"] == {"sent": 2} and figures["calls"] > 0 and figures["episodes_lost"] == 0
    assert figures["health_probes"] > 0 and figures["health_failed"] == 0


def test_an_unknown_attack_is_one_line(capsys):
    assert cli_main(["bench", "hardening", "--attacks", "none,teleport", "--baseline", "none"]) == 2
    assert "unknown attack(s) teleport" in capsys.readouterr().err
