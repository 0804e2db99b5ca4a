"""The group stream of trainer.mode=async (agentrl.rollout.sources.streaming) on real Ray rollout workers:
groups handed out up to the staleness bound, whole groups taken oldest first, stale ones dropped and
replaced on the newest weights, the dynamic-sampling filter consuming more of the stream (and giving
up on a policy without any signal), a pause for validation, and a checkpoint restored with the
groups in flight played again."""

from __future__ import annotations

import json
import time

import pytest

from agentrl.config.schema import Config
from agentrl.envs import TaskRef
from agentrl.rollout.sources.streaming import FILTER_PATIENCE, StreamingRollout, signal_free

from rollout_helpers import env_config, rollout_config

pytestmark = pytest.mark.slow


def tasks_of(iteration: int) -> list[TaskRef]:
    return [TaskRef("depth2", 2 * iteration), TaskRef("depth2", 2 * iteration + 1)]


def config(**trainer) -> Config:
    cfg = Config()
    cfg.env = env_config("textcraft", max_steps=2, group_size=2, tasks_per_iteration=2)
    cfg.rollout = rollout_config(max_response_tokens=4, max_prompt_tokens=256, prompt_truncation="left")
    cfg.trainer.mode, cfg.trainer.max_staleness, cfg.trainer.seed = "async", 1, 5
    for key, value in trainer.items():
        setattr(cfg.trainer, key, value)
    return cfg


@pytest.fixture(scope="module")
def workers(ray_cluster, tiny_model_dir):
    from agentrl.rollout.worker_group import RolloutWorkerGroup

    cfg = config()
    with RolloutWorkerGroup(tiny_model_dir, cfg.rollout, cfg.env, num_workers=2, num_envs=4, worker_num_cpus=0.5,
                            env_num_cpus=0.5) as group:
        yield group


def test_groups_stream_up_to_the_bound_stale_ones_are_replaced_and_a_checkpoint_resumes(workers, tiny_model_dir,
                                                                                       tiny_tokenizer, tmp_path):
    from agentrl.models import build_tiny_model
    from rollout_helpers import TINY

    workers.load_weights(build_tiny_model(TINY, tiny_tokenizer, seed=0).state_dict(), version=0)
    stream = StreamingRollout(workers, tasks_of, config())
    try:
        assert stream.start(0, None) is None
        # (1 + max_staleness) iterations' groups handed out, spread over the two workers
        assert sorted(stream.in_flight) == [0, 1, 2, 3] and sorted(stream.in_flight.values()) == [0, 0, 1, 1]
        # at the bound the workers finish and idle: the stream says so (the learner then borrows their
        # cores), with the finished groups collected
        deadline = time.monotonic() + 120
        while stream.busy():
            assert time.monotonic() < deadline, f"the stream stayed busy with groups {sorted(stream.in_flight)}"
            time.sleep(0.05)
        assert not stream.in_flight and len(stream.buffer) == 4
        first = stream.next_batch(1)
        ids = sorted(set(first.result.batch.group_id.tolist()))
        assert len(ids) == 2 and set(ids) <= {0, 1, 2, 3}
        for gid in ids:     # a whole group: both episodes, their own task, trajectory ids g * 2 + k
            assert sorted({e.traj_id for e in first.result.episodes if e.group_id == gid}) == [2 * gid, 2 * gid + 1]
            assert {e.task for e in first.result.episodes if e.group_id == gid} == {tasks_of(gid // 2 + 1)[gid % 2]}
        assert first.metrics["async/staleness_max"] == 0.0 and first.metrics["async/groups_dropped"] == 0
        # after the take, only the groups the learner takes up to version 0 + max_staleness stay: 2
        assert len(stream.in_flight) + len(stream.buffer) == 2 and stream.next_group == 4

        # the learner jumps to version 3: every group that started on version 0 is too stale, dropped, and
        # replaced by new ones that start on the new weights (which of groups 0-5 had started by then
        # depends on timing; at least the one the busier worker was playing had)
        workers.load_weights(build_tiny_model(TINY, tiny_tokenizer, seed=0).state_dict(), version=3)
        fresh = stream.next_batch(4)
        assert fresh.metrics["async/groups_dropped"] >= 1 and set(fresh.result.batch.policy_version.tolist()) <= {2, 3}
        assert fresh.metrics["async/staleness_max"] <= 1

        with stream.paused():          # validation: every worker stops after the groups it started
            assert not stream.serving and not stream.in_flight
            before = len(stream.buffer)
        assert len(stream.buffer) == before and stream.serving
        stream.collect(5.0)
        stream.save(tmp_path / "buffer")
        state = json.loads((tmp_path / "buffer" / "stream.json").read_text())
        saved_groups = len(list((tmp_path / "buffer").glob("group_*")))
    finally:
        stream.close()

    again = StreamingRollout(workers, tasks_of, config())
    try:
        line = again.start(4, tmp_path / "buffer")
        assert line == f"restored {saved_groups} buffered groups; {len(state['in_flight'])} groups that were in flight run again"
        assert sorted(again.in_flight)[:len(state["in_flight"])] == sorted(state["in_flight"])
        assert again.next_group >= state["next_group"]
        batch = again.next_batch(5)
        assert len(set(batch.result.batch.group_id.tolist())) == 2
    finally:
        again.close()


def test_the_filter_consumes_more_of_the_stream_and_gives_up_on_a_policy_without_signal(workers):
    # a random tiny policy never wins a TextCraft task: every group's returns are equal (no signal), so the
    # filter leaves out FILTER_PATIENCE groups per place in the batch and then trains on them anyway
    stream = StreamingRollout(workers, tasks_of, config(filter_groups=True, oversample=1.5))
    try:
        stream.start(0, None)
        assert len(stream.in_flight) == 6       # (1 + 1) * 2 groups, times 1.5
        taken = stream.next_batch(1)
        assert all(signal_free(g) for g in stream.buffer.groups) or len(stream.buffer) == 0
        assert taken.metrics["async/groups_filtered"] == FILTER_PATIENCE * 2
        assert len(set(taken.result.batch.group_id.tolist())) == 2
        assert stream.next_group >= 2 + FILTER_PATIENCE * 2
    finally:
        stream.close()


def test_a_stop_that_reaches_a_worker_before_its_serve_call_starts_still_stops_it(workers):
    # the trainer pauses the stream for validation right after starting it: the stop (in the stream
    # concurrency group) can reach the worker before serve_groups (in the default group) begins; a
    # stop of an earlier session (one whose serve call never ran) must not stop a later one
    import ray

    from agentrl.rollout.group_pool import GroupSpec

    worker = workers.workers[0]
    workers.add_groups(0, [GroupSpec(tasks_of(1)[0], 0, 0)], 7)
    ray.get(worker.stop_serving.options(concurrency_group="stream").remote(7))
    serving = worker.serve_groups.remote(workers.sampling_params(seed=0), 2, 0, False, 0, 7)
    unstarted = ray.get(serving, timeout=60)
    assert [spec.group_id for spec in unstarted] == [0]
    # session 8 plays until it is stopped itself
    again = worker.serve_groups.remote(workers.sampling_params(seed=0), 2, 0, False, 0, 8)
    ready, _ = ray.wait([again], timeout=2)
    assert not ready
    ray.get(worker.stop_serving.options(concurrency_group="stream").remote(8))
    assert ray.get(again, timeout=60) == []
