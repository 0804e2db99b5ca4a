"""ALFWorld game generation at scale: parallel equals serial, a killed run resumes, the paper's sizes,
and ``agentrl bench alfworld`` at a tiny size."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

_MISSING = [m for m in ("alfworld", "textworld", "fast_downward") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"ALFWorld engine not installed (missing: "
                                f"{', '.join(_MISSING)}); `pip install alfworld`")

COUNTS = {"train": 4, "valid_seen": 1, "valid_unseen": 1}
SEED = 5


def tree(root: str) -> dict[str, bytes]:
    """Every file under ``root/json_2.1.1``: relative path -> content."""
    base = os.path.join(root, "json_2.1.1")
    files = {}
    for dirpath, _, names in os.walk(base):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, base)] = f.read()
    return files


@pytest.fixture(scope="module")
def serial_set(tmp_path_factory):
    from agentrl_env_alfworld.generate import generate_games

    out = str(tmp_path_factory.mktemp("serial"))
    report = generate_games(out, COUNTS, seed=SEED, workers=1)
    assert report["generated"] == sum(COUNTS.values()) and report["skipped"] == 0
    return out


def test_parallel_generation_gives_the_serial_games(serial_set, tmp_path):
    from agentrl_env_alfworld.generate import MANIFEST_FILE, generate_games

    report = generate_games(str(tmp_path), COUNTS, seed=SEED, workers=2)
    assert tree(str(tmp_path)) == tree(serial_set)
    assert len(tree(serial_set)) == 2 * sum(COUNTS.values())
    with open(tmp_path / MANIFEST_FILE) as f:
        manifest = json.load(f)
    assert manifest["complete"] and manifest["counts"] == COUNTS and manifest["seed"] == SEED
    # the returned trials are in split and index order, as the serial run's
    serial = generate_games(serial_set, COUNTS, seed=SEED, workers=1)
    assert [os.path.relpath(t, str(tmp_path)) for t in report["trials"]] == \
        [os.path.relpath(t, serial_set) for t in serial["trials"]]
    assert serial["generated"] == 0 and serial["skipped"] == sum(COUNTS.values())


KILLED_RUN = textwrap.dedent("""
    import sys, time
    import agentrl_env_alfworld.generate as gen

    real = gen._generate_and_write

    def slow_after_three(out, seed, split, index, *rest):
        if not (split == "train" and index < 3):
            time.sleep(120)  # killed here: the first three train games are the finished ones
        return real(out, seed, split, index, *rest)

    gen._generate_and_write = slow_after_three
    gen.generate_games(sys.argv[1], {counts!r}, seed={seed}, workers=2)
""")


def test_a_generation_process_reuses_one_engine_env(monkeypatch):
    """Each new engine env loads a private copy of Fast Downward's library that is never unloaded
    (~3 MB per game a worker made); a process solves every game on one env, reloaded, and the games
    are the ones a fresh env per game gives."""
    import fast_downward

    from agentrl_env_alfworld import generate

    copies = []
    load_lib = fast_downward.load_lib
    monkeypatch.setattr(fast_downward, "load_lib", lambda: copies.append(1) or load_lib())
    monkeypatch.setattr(generate, "_solving_engines", {})
    reused = [generate.generate_game(SEED, "train", i) for i in range(3)]
    assert len(copies) == 1
    fresh = []
    for i in range(3):
        monkeypatch.setattr(generate, "_solving_engines", {})
        fresh.append(generate.generate_game(SEED, "train", i))
    assert len(copies) == 4
    assert json.dumps(reused, sort_keys=True) == json.dumps(fresh, sort_keys=True)


def test_killed_generation_resumes_without_redoing_finished_games(serial_set, tmp_path):
    from agentrl_env_alfworld.generate import finished_games, generate_games

    out = str(tmp_path / "set")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN.format(counts=COUNTS, seed=SEED), out],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(finished_games(out, SEED, "train")) < 3:
            assert proc.poll() is None, "the generation ended before it was killed"
            assert time.monotonic() < deadline, "three games did not appear"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {i: os.stat(os.path.join(t, "game.tw-pddl")) for i, t in finished_games(out, SEED, "train").items()}
    assert sorted(before) == [0, 1, 2]
    # what a kill between the two writes of game 3 leaves: its traj file and a half-written game file
    serial_trial = dict(finished_games(serial_set, SEED, "train"))[3]
    trial = os.path.join(out, os.path.relpath(serial_trial, serial_set))
    os.makedirs(trial)
    with open(os.path.join(trial, "traj_data.json"), "w") as f:
        f.write("{}")
    with open(os.path.join(trial, "game.tw-pddl.4242.partial"), "w") as f:
        f.write('{"pddl_dom')

    report = generate_games(out, COUNTS, seed=SEED, workers=2)
    assert (report["skipped"], report["generated"]) == (3, sum(COUNTS.values()) - 3)
    assert tree(out) == tree(serial_set)  # full, identical, no leftovers
    for i, st in before.items():  # the finished games were not written again
        again = os.stat(os.path.join(finished_games(out, SEED, "train")[i], "game.tw-pddl"))
        assert (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


def test_another_recipe_is_refused_and_paper_sizes(tmp_path, serial_set):
    import argparse

    from agentrl_env_alfworld.cli import add_cli, generate_counts
    from agentrl_env_alfworld.generate import generate_games
    from agentrl_env_alfworld.tasks import PAPER_SPLIT_SIZES

    with pytest.raises(ValueError, match="seed 5 there, 6 asked"):
        generate_games(serial_set, COUNTS, seed=6, workers=1)
    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers())
    args = parser.parse_args(["alfworld", "generate", "--out", "x", "--paper-sizes"])
    assert generate_counts(args) == PAPER_SPLIT_SIZES == {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
    args = parser.parse_args(["alfworld", "generate", "--out", "x", "--n", "8", "--n-valid-unseen", "3"])
    assert generate_counts(args) == {"train": 8, "valid_seen": 6, "valid_unseen": 3}


@pytest.mark.slow
def test_bench_alfworld_tiny(capsys):
    from agentrl.cli.main import main as cli_main

    assert cli_main(["bench", "alfworld", "--generate", "2", "--tasks", "2", "--group-size", "2",
                     "--shards", "1", "2", "--rounds", "1", "--node-cores", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    results = report["results"]
    assert results["generate"]["games"] == 2 and results["generate"]["projected_paper_seconds"] > 0
    pools = {p["shards"]: p for p in results["pool"]}
    for shards in (1, 2):
        p = pools[shards]
        assert "error" not in p, p
        assert p["instances"] == 4 and p["steps"] > 0 and p["steps_per_s"] > 0
        assert p["steps_per_s_per_worker"] == pytest.approx(p["steps_per_s"] / shards)
        assert p["episodes_won"] == 4 and p["rss_mb_per_game"] > 0 and len(p["reset_batch_s"]) == 1
    sizing = results["sizing"]
    assert [r["workers"] for r in sizing["rows"]] == [1, 2, 4, 8]
    assert all(r["memory_gb"] > 0 and r["steps_per_s"] > 0 for r in sizing["rows"])
    assert len(report["meta"]["load_avg_start"]) == 3
