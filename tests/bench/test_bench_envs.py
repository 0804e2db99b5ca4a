"""The env benchmarks run and report steps per second: ``agentrl bench envs`` through the HTTP pool
server, ``agentrl bench webshop-steps`` on one core and ``agentrl bench alfworld-steps`` over a
process pool; ``agentrl bench env-server`` runs the HTTP server and the stdlib one it replaced.
"""

from __future__ import annotations

import json

import pytest

from agentrl.cli.main import main as cli_main
from agentrl.errors import UsageError

pytestmark = pytest.mark.slow


def test_bench_envs_http_reports_steps_per_second(capsys):
    assert cli_main(["bench", "envs", "--envs", "textcraft", "--no-ray", "--seconds", "0.3", "--tasks", "4",
                     "--pool-size", "4", "--shards", "2", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)["textcraft"]
    http = entry["http (4 envs, 2 processes)"]
    assert "error" not in http, http
    assert http["steps"] > 0 and http["steps_per_s"] > 0 and http["resets"] >= 4
    assert entry["in-process"]["steps_per_s"] > 0


def test_bench_webshop_steps_plays_expert_and_random_episodes(capsys):
    assert cli_main(["bench", "webshop-steps", "--episodes", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines] == [["expert", "4", "episodes,"], ["random", "4", "episodes,"]]
    assert all(line.endswith("steps/s") for line in lines)
    assert cli_main(["bench", "webshop-steps", "--episodes", "4", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    for name in ("expert", "random"):
        assert results[name]["episodes"] == 4 and results[name]["steps"] >= 4 and results[name]["steps_per_s"] > 0


def test_bench_alfworld_steps_measures_each_pool_size(alfworld_search_games, capsys):
    assert cli_main(["bench", "alfworld-steps", "--data-dir", alfworld_search_games, "--split", "train",
                     "--episodes", "2", "--steps", "3", "--workers", "1", "2", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["workers"] for r in results] == [1, 2]
    for r in results:
        assert r["resets"] == 2 * r["workers"] and 0 < r["steps"] <= 2 * 3 * r["workers"]
        assert r["steps_per_s"] > 0 and r["resets_per_s"] > 0 and r["split"] == "train"
    assert cli_main(["bench", "alfworld-steps", "--data-dir", alfworld_search_games, "--split", "train",
                     "--episodes", "1", "--steps", "2", "--workers", "1"]) == 0
    assert capsys.readouterr().out.startswith("workers=1: ")


def test_bench_env_server_runs_both_servers_interleaved(capsys):
    """The baseline is HEAD's server taken from git (a shallow clone has HEAD; the default baseline, the
    stdlib server of 036ef7e^, needs the history)."""
    assert cli_main(["bench", "env-server", "--rounds", "1", "--seconds", "0.3", "--tasks", "4", "--pool-size", "4",
                     "--shards", "2", "--baseline", "HEAD", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    entry = report["results"]["textcraft"]
    assert all(len(entry["steps_per_s"][kind]) == 1 and entry["median"][kind] > 0 for kind in ("new", "old"))
    assert entry["new_over_old"] > 0 and report["meta"]["baseline"] == "HEAD"


def test_bench_env_server_names_a_revision_git_does_not_know(capsys):
    assert cli_main(["bench", "env-server", "--rounds", "1", "--baseline", "no-such-revision"]) == UsageError.exit_code
    assert "--baseline no-such-revision: git archive failed" in capsys.readouterr().err
