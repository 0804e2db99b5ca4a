"""Training modes declared once (agentrl.config.modes): every reader asks the declaration, a mode of
one's own loads by import path, and a bad name is one line."""

import re
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.config.modes import ASYNC, ONE_STEP_OFF, SYNC, TrainingMode, training_mode
from agentrl.errors import UsageError
from agentrl.rollout.sources import rollout_source
from agentrl.rollout.sources.sync import SyncRollout
from agentrl.training.cpu_cores import rollout_thread_shares

PACKAGE = Path(__file__).resolve().parents[2] / "agentrl"

# a mode of one's own: the synchronous source, declared as overlapped (its learner shares the cores)
SHARED_SYNC = TrainingMode("shared_sync", "sync rollouts with the cores shared as if overlapped",
                           source="agentrl.rollout.sources.sync:SyncRollout", overlapped=True, ahead=1)
NOT_A_MODE = {"name": "dict"}


def test_the_builtin_modes_declare_what_their_readers_ask():
    trainer = load_config(None, ["trainer.max_staleness=3"]).trainer
    assert [m.versions_ahead(trainer) for m in (SYNC, ONE_STEP_OFF, ASYNC)] == [0, 1, 3]
    assert [m.staleness_levels(trainer) for m in (SYNC, ONE_STEP_OFF, ASYNC)] == [0, 2, 4]
    assert [m.cpu_shares(3) for m in (SYNC, ONE_STEP_OFF, ASYNC)] == [None, 4, 4]
    assert (SYNC.streams_groups, ASYNC.streams_groups) == (False, True)


def test_a_mode_of_ones_own_loads_by_import_path_and_drives_every_reader():
    cfg = load_config(None, [f"trainer.mode={__name__}:SHARED_SYNC", "rollout.num_workers=2"])
    assert training_mode(cfg.trainer.mode) is SHARED_SYNC
    assert rollout_thread_shares(cfg) == 3          # the learner counts as one more worker
    source = rollout_source(cfg, workers=None, tasks_of=lambda i: [])
    assert isinstance(source, SyncRollout)


@pytest.mark.parametrize("spec, message", [
    ("synk", r"unknown training mode trainer.mode='synk'; did you mean sync"),
    ("no_such_module_xyz:MODE", r"cannot import 'no_such_module_xyz'"),
    (f"{__name__}:NOT_A_MODE", r"is not a training mode"),
])
def test_a_bad_mode_is_one_line(spec, message):
    with pytest.raises(UsageError, match=message):
        load_config(None, [f"trainer.mode={spec}"])


def test_no_module_compares_the_mode_name():
    """The mode's properties are read, never its name (agentrl/config/modes.py declares the modes)."""
    compares = re.compile(r"""mode\s*(==|!=|in)\s*\(?["'](sync|one_step_off|async)["']""")
    found = [f"{path.relative_to(PACKAGE.parent)}:{n}" for path in sorted(PACKAGE.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if compares.search(line)]
    assert not found, "compare a TrainingMode property instead:\n" + "\n".join(found)
