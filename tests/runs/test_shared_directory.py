"""The run directory must be one directory for this process and every learner rank, else each rank's
checkpoint files land on its own node (agentrl.runs.shared_directory). The ranks' side runs on
directories that really differ: rank 1's "node" has another directory at the same path, or none.
The same check on a real non-shared filesystem (a node in a mount namespace of its own):
tests/runtime/test_multinode.py."""

from __future__ import annotations

import re
import time

import pytest

from agentrl.errors import UsageError
from agentrl.learner.rank_calls import RankPlace
from agentrl.runs.directory import RunDirectory
from agentrl.runs.shared_directory import VISIBLE_WITHIN_S, check_shared_directory, view_of_directory

PLACES = [RankPlace(0, "192.0.2.1", ("node_a",), 11), RankPlace(1, "192.0.2.2", ("node_b",), 22),
          RankPlace(2, "192.0.2.3", (), 33)]


def views_seeing(seen_by_rank):
    """``views_of`` for check_shared_directory: rank r's view of ``seen_by_rank[r]`` (None: the
    directory this process checks), what a rank whose node mounts that directory there would see."""
    def views_of(directory, nonce):
        return [view_of_directory(str(seen or directory), nonce, rank) for rank, seen in enumerate(seen_by_rank)]
    return views_of


def test_ranks_that_see_the_directory_pass_and_leave_no_marker(tmp_path):
    (tmp_path / "config.yaml").write_text("kept")
    check_shared_directory(str(tmp_path), PLACES, views_seeing([None, None, None]))
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_ranks_that_see_another_directory_or_none_are_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "driver" / "run"
    run_dir.mkdir(parents=True)
    elsewhere = tmp_path / "node_b" / "run"      # node B's own disk: the same path holds another directory
    elsewhere.mkdir(parents=True)
    start = time.monotonic()
    with pytest.raises(UsageError) as err:
        check_shared_directory(str(run_dir), PLACES, views_seeing([None, elsewhere, tmp_path / "absent"]))
    assert time.monotonic() - start < VISIBLE_WITHIN_S + 5
    message = str(err.value)
    assert "\n" not in message
    assert re.fullmatch(
        rf"trainer\.output_dir is not one directory for every learner rank: in {re.escape(str(run_dir))}, learner rank 1 "
        r"\(node 192\.0\.2\.2 \[node_b\], pid 22\) does not see the marker this process wrote there \(a different "
        r"directory of that path\); learner rank 2 \(node 192\.0\.2\.3, pid 33\) does not see the marker this process "
        r"wrote there \(no directory of that path on its node\)\. Each rank writes its share of every checkpoint "
        r"there, so the checkpoints on this node \((?:[\d.]+, )?host [\w.-]+\) would lack those ranks' files; put "
        r"trainer\.output_dir on a filesystem that every node mounts at the same path \(e\.g\. NFS\), or run the "
        r"learner ranks on this node \(placement\.learner naming a resource of this node\)", message), message
    assert list(run_dir.iterdir()) == [] and list(elsewhere.iterdir()) == []     # no marker left behind


def test_the_run_directory_is_absolute_for_ranks_that_run_elsewhere(tmp_path, monkeypatch):
    """A Ray actor runs in the directory its node's `ray start` ran in, not this process's: a relative
    trainer.output_dir (the default, `runs`) would name another directory there."""
    from agentrl.config.schema import Config

    monkeypatch.chdir(tmp_path)
    cfg = Config()
    cfg.trainer.output_dir, cfg.trainer.run_name = "runs", "run"
    run = RunDirectory.create(cfg, None)
    assert run.path == tmp_path / "runs" / "run" and run.path.is_absolute()
