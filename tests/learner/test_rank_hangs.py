"""A learner rank that never returns from a collective call is reported within a bound
(learner.collective_timeout_s), with one line naming it, instead of after DeepSpeed's 30 minutes
(agentrl.learner.rank_calls): two real gloo ranks as Ray actors, one of them stopped with SIGSTOP."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

ray = pytest.importorskip("ray")

from agentrl.learner.group import LearnerGroup
from agentrl.learner.rank_calls import HUNG_PEER_GRACE_S, LearnerHangError, RankPlace, wait_for_ranks
from tiny_setup import learner_config, step_batch, write_tiny_model

PLACES = [RankPlace(0, "192.0.2.1", ("node_a",), 11), RankPlace(1, "192.0.2.2", (), 22)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_a_stopped_rank_is_named_once_its_peer_times_out_in_a_collective(model_dir, ray_cluster):
    timeout_s = 3.0
    group = LearnerGroup(learner_config(num_ranks=2, collective_timeout_s=timeout_s), model_dir)
    stopped = group.places[1].pid
    try:
        batch = group.compute_logprobs(step_batch(6, seed=2))
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(LearnerHangError) as err:
            group.update(batch)
        waited = time.monotonic() - start
    finally:
        os.kill(stopped, signal.SIGCONT)
        start_shutdown = time.monotonic()
        group.shutdown()
        shutdown_s = time.monotonic() - start_shutdown
    message = str(err.value)
    assert re.fullmatch(rf"learner rank 1 \(node [\d.]+, pid {stopped}\) did not return from update in [\d.]+ s: "
                        r"rank 0 timed out waiting for a peer in a collective \(learner\.collective_timeout_s=3\); "
                        r"its process is stopped or stuck outside the learner's collectives", message), message
    # the process group's timeout, then the grace for other waiting ranks, not DeepSpeed's 30 minutes
    bound = timeout_s + min(HUNG_PEER_GRACE_S, timeout_s)
    assert bound - 0.5 < waited < bound + 10, waited
    assert group.broken and shutdown_s < 10, shutdown_s     # the ranks are killed, not asked to close


def test_a_rank_that_returns_long_after_its_peer_is_reported(ray_cluster):
    @ray.remote(num_cpus=0)
    def returns(seconds):
        time.sleep(seconds)
        return seconds

    slow = returns.remote(60)
    try:
        start = time.monotonic()
        with pytest.raises(LearnerHangError) as err:
            wait_for_ranks([returns.remote(0), slow], PLACES, "save_checkpoint", timeout_s=1.0)
        assert 1.0 <= time.monotonic() - start < 10
    finally:
        ray.cancel(slow, force=True)
    assert str(err.value).startswith("learner rank 1 (node 192.0.2.2, pid 22) did not return from save_checkpoint in ")
    assert ": rank 0 had returned 1 s earlier (learner.collective_timeout_s=1); its process is stopped" in str(err.value)
    assert wait_for_ranks([returns.remote(0), returns.remote(0.2)], PLACES, "update", 5.0) == [0, 0.2]


def test_a_rank_failure_that_is_not_a_timeout_is_raised_at_once(ray_cluster):
    @ray.remote(num_cpus=0)
    def fails():
        raise ValueError("CUDA out of memory")

    @ray.remote(num_cpus=0)
    def waits():
        time.sleep(60)

    waiting = waits.remote()
    try:
        start = time.monotonic()
        with pytest.raises(ValueError, match="CUDA out of memory"):
            wait_for_ranks([fails.remote(), waiting], PLACES, "update", timeout_s=30.0)
        assert time.monotonic() - start < 10
    finally:
        ray.cancel(waiting, force=True)


def test_a_rank_whose_process_ended_names_the_rank_still_running_when_no_node_was_lost(ray_cluster):
    """What NCCL's watchdog does on GPUs: it ends the process of a rank that waited
    learner.collective_timeout_s in a collective; the rank it waited for is still running."""
    @ray.remote(num_cpus=0)
    class Rank:
        def run(self, seconds):
            time.sleep(seconds)
            return seconds

    ended, running = Rank.remote(), Rank.remote()
    try:
        refs = [ended.run.remote(60), running.run.remote(60)]
        ray.kill(ended)
        start = time.monotonic()
        with pytest.raises(LearnerHangError) as err:
            wait_for_ranks(refs, PLACES, "update", timeout_s=300.0, died_wait_s=2.0)
        assert 2.0 <= time.monotonic() - start < 10
    finally:
        ray.kill(running)
    assert re.fullmatch(r"learner rank 1 \(node 192\.0\.2\.2, pid 22\) did not return from update in [\d.]+ s: rank 0's "
                        r"process ended meanwhile \(\w+\) and no Ray node was lost, as when NCCL's watchdog ends a rank "
                        r"that waited for a peer in a collective \(learner\.collective_timeout_s=300\); its process is "
                        r"stopped or stuck outside the learner's collectives", str(err.value)), str(err.value)
