"""`agentrl train` with trainer.mode=async against a standalone env server that dies for good: the
group stream's workers fail past rollout.max_env_failures, and the run stops with one line and exit
code 2, its newest checkpoint complete with the stream's buffer (the groups in flight recorded, to
be played again on resume), never a traceback."""

import json

import pytest

from test_train_failure_cap import train_until_the_env_server_dies

pytestmark = pytest.mark.slow


def test_dead_env_server_stops_async_training_with_a_checkpoint_of_the_stream(tmp_path):
    log, checkpoints, newest = train_until_the_env_server_dies(tmp_path, "rollout.max_env_failures=1",
                                                                "trainer.mode=async")
    assert "more than rollout.max_env_failures=1" in log.strip().splitlines()[-1]
    assert (newest / "trainer_state.json").is_file() and (newest / "learner").is_dir()
    state = json.loads((newest / "rollout_buffer" / "stream.json").read_text())
    assert state["next_group"] >= 2 and isinstance(state["in_flight"], list)
    assert not list(checkpoints.glob("*.partial"))
