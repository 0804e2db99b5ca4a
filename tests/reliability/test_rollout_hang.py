"""Fault 9: a rollout that stops making progress. An env server process that is stopped (SIGSTOP,
as a machine that swaps or a server deadlocked would be) or a rollout worker process that is stopped
is reported after rollout.hang_timeout_s with one line naming the worker, its node and process, and
what it was doing with which env instances, instead of waiting forever; `agentrl train` then stops
with exit code 2 and a loadable checkpoint."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from agentrl.config.schema import EnvConfig, RolloutConfig
from agentrl.envs import TaskRef
from agentrl.models import build_tiny_model, train_tokenizer
from agentrl.rollout.worker_group import RolloutWorkerGroup
from agentrl.rollout.worker_calls import WEIGHTS_GROUP, RolloutHangError
from test_train_failure_cap import free_port, serve_textcraft, train_until_first_checkpoint

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.config.schema import TinyModelConfig
    from agentrl.warmstart.demonstrations import corpus_texts

    tokenizer = train_tokenizer(corpus_texts("textcraft", {}, "train", 20, history_length=1, think=False,
                                             style="compact"), vocab_size=400)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                             intermediate_size=64), tokenizer, seed=0)
    out = tmp_path_factory.mktemp("hang") / "model"
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)


def group_of(model_dir: str, hang_timeout_s: float) -> RolloutWorkerGroup:
    # a long rollout (a random policy rarely finishes), and env calls that would wait 5 minutes
    env_cfg = EnvConfig(name="textcraft", max_steps=200, group_size=2, tasks_per_iteration=1, history_length=1,
                        step_timeout_s=600.0)
    cfg = RolloutConfig(max_response_tokens=4, max_prompt_tokens=256, prompt_truncation="left", enable_thinking=False,
                        prompt_style="compact", hang_timeout_s=hang_timeout_s)
    return RolloutWorkerGroup(model_dir, cfg, env_cfg, num_workers=1, worker_num_cpus=0.5, env_num_cpus=0.5)


def wait_rolling_out(worker, doing: str = "") -> None:
    """Until the worker runs a rollout call (and its engine is ``doing`` something starting so)."""
    deadline = time.time() + 60
    while True:
        status = ray.get(worker.status.options(concurrency_group=WEIGHTS_GROUP).remote())
        if status["rolling_out"] and status["doing"].startswith(doing):
            return
        assert time.time() < deadline, status
        time.sleep(0.02)


def test_a_stopped_env_pool_process_is_reported_with_the_worker_and_the_env_instances(ray_cluster, model_dir):
    with group_of(model_dir, hang_timeout_s=2.0) as group:
        env_pid = ray.get(group._owned_actors[0].__ray_call__.remote(lambda actor: os.getpid()))
        pending = group.submit([TaskRef("depth2", 0)], group_size=2, seed=0)
        wait_rolling_out(group.workers[0], doing="generating")     # past the resets: the next env call is a step
        os.kill(env_pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(RolloutHangError) as err:
                pending.result()
            waited = time.monotonic() - start
        finally:
            os.kill(env_pid, signal.SIGCONT)
    message = str(err.value)
    assert re.fullmatch(r"rollout worker 0 \(node [\d.]+, pid \d+\) made no progress for [\d.]+ s, more than "
                        r"rollout\.hang_timeout_s=2: (waiting for an env step of|resetting env) instances [\d, -]+ on 1 "
                        r"Ray env pool "
                        r"actor\(s\) of textcraft", message), message
    assert waited < 30, waited


def test_a_stopped_rollout_worker_is_reported_as_not_answering(ray_cluster, model_dir):
    with group_of(model_dir, hang_timeout_s=2.0) as group:
        worker_pid = ray.get(group.workers[0].status.remote())["pid"]
        pending = group.submit([TaskRef("depth2", 0)], group_size=2, seed=0)
        wait_rolling_out(group.workers[0])
        os.kill(worker_pid, signal.SIGSTOP)
        try:
            with pytest.raises(RolloutHangError, match=r"^rollout worker 0 did not answer a status request within 5 s"):
                pending.result()
        finally:
            os.kill(worker_pid, signal.SIGCONT)


def test_train_stops_with_one_line_and_a_checkpoint_when_the_env_server_hangs(tmp_path, ray_head):
    port = free_port()
    server = serve_textcraft(port)
    try:
        train, latest = train_until_first_checkpoint(tmp_path, port, "env.step_timeout_s=600",
                                                     "rollout.hang_timeout_s=3", ray_env=ray_head)
        out = tmp_path / "runs"
        assert latest.exists(), "no checkpoint before the fault"
        os.killpg(server.pid, signal.SIGSTOP)          # the server and its shard processes
        output, _ = train.communicate(timeout=300)
        assert train.returncode == 2, output[-3000:]
        last = [line for line in output.splitlines() if line.startswith("agentrl: error:")]
        assert len(last) == 1, output[-3000:]
        assert re.search(r"training stopped in iteration \d+: rollout worker 0 \(node [\d.]+, pid \d+\) made no "
                         r"progress for [\d.]+ s, more than rollout\.hang_timeout_s=3: (waiting for an env step of|"
                         rf"resetting env) instances [\d, -]+ on the env server at http://127\.0\.0\.1:{port}; checkpoint .*iter_\d+ "
                         r"holds iteration \d+; run the same command again to resume once the rollout workers are "
                         r"healthy", last[0]), last[0]
        done = latest.read_text().strip()
        assert (out / "run" / "checkpoints" / done / "trainer_state.json").is_file()
    finally:
        os.killpg(server.pid, signal.SIGCONT)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=60)
