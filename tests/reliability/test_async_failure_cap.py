"""`agentrl train` with trainer.mode=async against a standalone env server that dies for good: the
group stream's workers fail past rollout.max_env_failures, and the run stops with one line and exit
code 2, its newest checkpoint complete with the stream's buffer (the groups in flight recorded, to
be played again on resume), never a traceback."""

import json
import os
import signal

import pytest

from test_train_failure_cap import free_port, serve_textcraft, train_until_first_checkpoint

pytestmark = pytest.mark.slow


def test_dead_env_server_stops_async_training_with_a_checkpoint_of_the_stream(tmp_path):
    port = free_port()
    server = serve_textcraft(port)
    try:
        train, latest = train_until_first_checkpoint(tmp_path, port, "rollout.max_env_failures=1", "trainer.mode=async")
        assert latest.exists(), "no checkpoint before the fault"
        os.killpg(server.pid, signal.SIGKILL)  # the env server dies for good
        log, _ = train.communicate(timeout=400)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    assert train.returncode == 2, log[-3000:]
    last_line = log.strip().splitlines()[-1]
    assert last_line.startswith("agentrl: error: training stopped in iteration") and "resume" in last_line
    assert "more than rollout.max_env_failures=1" in last_line and "Traceback" not in log
    checkpoints = tmp_path / "runs" / "run" / "checkpoints"
    newest = checkpoints / latest.read_text().strip()
    assert (newest / "trainer_state.json").is_file() and (newest / "learner").is_dir()
    state = json.loads((newest / "rollout_buffer" / "stream.json").read_text())
    assert state["next_group"] >= 2 and isinstance(state["in_flight"], list)
    assert not list(checkpoints.glob("*.partial"))
