"""Faults 1 and 2: an env server process killed mid-rollout (a Ray pool actor, a standalone HTTP
shard) and an env step that hangs. The rollout completes; the episodes the fault ended are re-run
from reset (or masked out); the counts are in the rollout's stats; past the cap it stops.

Every test drives the real :class:`RolloutEngine` against real pool servers; only the generation
backend is a labelled test backend (scripted text), so the steps are known in advance.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import psutil
import pytest
import torch

from agentrl.config.schema import EnvConfig, RolloutConfig
from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.envs.server.http_server import ShardedHTTPServer
from agentrl.envs.server.ray_pool import launch_ray_shards
from agentrl.envs.server.client import LocalTransport
from agentrl.envs.server.pool import EnvPool
from agentrl.estimators import compute_advantages
from agentrl.rollout.engine import EnvFailureLimitError, RolloutEngine
from reliability_kit import VALID, FaultEnv, ScriptedTextBackend, record_figures

pytestmark = pytest.mark.slow


def configs(name: str = "test-fault", **rollout) -> tuple[RolloutConfig, EnvConfig]:
    rollout_cfg = RolloutConfig(max_response_tokens=16, prompt_style="compact", max_prompt_tokens=4000,
                                invalid_action_penalty=0.1, **rollout)
    env_cfg = EnvConfig(name="textcraft", max_steps=3, group_size=2, tasks_per_iteration=2, history_length=1,
                        step_timeout_s=20.0)
    return rollout_cfg, env_cfg


def check_complete(result, tasks, group_size):
    """Every episode present once, with a full trajectory and no env error left."""
    episodes = result.episodes
    assert sorted(e.traj_id for e in episodes) == list(range(len(tasks) * group_size))
    assert all(e.env_error is None for e in episodes)
    rows = result.batch.traj_id.tolist()
    assert sorted(set(rows)) == list(range(len(tasks) * group_size))
    for e in episodes:
        assert rows.count(e.traj_id) == e.length


def local_client(tmp_path, **faults) -> tuple[EnvClient, EnvPool]:
    pool = EnvPool("test-fault", 4, {**faults, "once_dir": str(tmp_path)}, call_timeout_s=0.5)
    return EnvClient([(0, 4, LocalTransport(pool))]), pool


def call_threads() -> set[threading.Thread]:
    """The pool's threads: its watchdog and the daemon threads that run the calls."""
    return {t for t in threading.enumerate() if t.name.startswith("env-pool")}


def test_hung_step_is_abandoned_the_instance_rebuilt_and_the_episode_rerun(tokenizer, tmp_path):
    before = call_threads()
    client, pool = local_client(tmp_path, hang_step=2, hang_s=3.0)
    rollout_cfg, env_cfg = configs()
    engine = RolloutEngine(ScriptedTextBackend(tokenizer, VALID), tokenizer, client, rollout_cfg, env_cfg,
                           env_name="test-fault")
    tasks = [TaskRef("tasks", 0), TaskRef("tasks", 1)]
    start = time.perf_counter()
    result = engine.run(tasks, 2, seed=1)
    elapsed = time.perf_counter() - start
    check_complete(result, tasks, 2)
    assert result.stats["env_failures"] == 1 and result.stats["episodes_rerun"] == 1
    assert all(e.won for e in result.episodes)
    assert pool.failures == 1 and elapsed < 3.0  # the hung call was abandoned, not waited for
    record_figures("env step hangs (pool call timeout 0.5 s, hang 3 s)", faults_injected=1,
                   env_failures=result.stats["env_failures"], episodes_recovered=result.stats["episodes_rerun"],
                   episodes_lost=0, rollout_s=round(elapsed, 2))
    assert any(t.is_alive() for t in call_threads() - before)  # the abandoned call's thread hangs on
    client.close()
    # closing ends the watchdog and the idle threads; the abandoned thread ends once its hung call returns
    deadline = time.monotonic() + 10
    while call_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not call_threads() - before


def test_mask_mode_drops_the_failed_episode_and_its_group_is_normalised_without_it(tokenizer, tmp_path):
    client, pool = local_client(tmp_path, raise_step=2)
    rollout_cfg, env_cfg = configs(on_env_failure="mask")
    engine = RolloutEngine(ScriptedTextBackend(tokenizer, VALID), tokenizer, client, rollout_cfg, env_cfg,
                           env_name="test-fault")
    result = engine.run([TaskRef("tasks", 0), TaskRef("tasks", 1)], 2, seed=1)
    failed = [e for e in result.episodes if e.env_error]
    assert len(result.episodes) == 4 and len(failed) == 1 and "injected engine fault" in failed[0].env_error
    assert result.stats["episodes_masked"] == 1 and result.stats["episodes_rerun"] == 0
    assert failed[0].traj_id not in result.batch.traj_id.tolist()
    advantages, diagnostics = compute_advantages("grpo", result.batch)
    assert torch.isfinite(advantages).all()
    # the group that lost an episode is a singleton now: its advantage is 0, not a stale mean
    survivor = [e.traj_id for e in result.episodes if e.group_id == failed[0].group_id and not e.env_error]
    rows = result.batch.traj_id == survivor[0]
    assert torch.all(advantages[rows] == 0)
    record_figures("env step raises (mask mode)", faults_injected=1, env_failures=result.stats["env_failures"],
                   episodes_masked=result.stats["episodes_masked"], episodes_lost_unreported=0)
    client.close()


def test_killed_http_shard_is_restarted_and_its_episodes_rerun(tokenizer):
    server = ShardedHTTPServer("textcraft", 4, shards=2)
    server.start_background()
    killed = []

    def kill_shard_1(call: int) -> None:
        if call == 1:  # before the second step: instances 2 and 3 are mid-episode
            child = server.children[0]
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            killed.append(child.pid)

    try:
        client = EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=20)
        rollout_cfg, env_cfg = configs()
        engine = RolloutEngine(ScriptedTextBackend(tokenizer, VALID, hook=kill_shard_1), tokenizer, client,
                               rollout_cfg, env_cfg)
        tasks = [TaskRef("train", 0), TaskRef("train", 1)]
        result = engine.run(tasks, 2, seed=3)
        check_complete(result, tasks, 2)
        assert killed and server.restarts == 1 and server.children[0].pid != killed[0]
        assert result.stats["episodes_rerun"] == 2  # the two episodes of the killed shard
        # the restarted shard serves again on its old port, through the same client
        deadline = time.monotonic() + 60
        while not client.reset([(2, TaskRef("train", 5))], timeout=20, on_shard_error="report")[0].ok:
            assert time.monotonic() < deadline, "the killed shard did not come back"
            time.sleep(0.2)
        assert all(e.length == 3 for e in result.episodes)
        record_figures("HTTP shard process SIGKILLed mid-rollout", faults_injected=1,
                       env_failures=result.stats["env_failures"], episodes_recovered=result.stats["episodes_rerun"],
                       episodes_lost=0, shard_restarts=server.restarts)
        client.close()
    finally:
        server.close()


def test_a_shard_that_stays_dead_stops_the_rollout_past_the_cap(tokenizer):
    server = ShardedHTTPServer("textcraft", 4, shards=2, restart_shards=False)
    server.start_background()
    try:
        client = EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=20)
        rollout_cfg, env_cfg = configs(max_env_failures=1)
        server.children[0].kill()
        server.children[0].wait(10)
        engine = RolloutEngine(ScriptedTextBackend(tokenizer, VALID), tokenizer, client, rollout_cfg, env_cfg)
        with pytest.raises(EnvFailureLimitError, match="more than rollout.max_env_failures=1") as err:
            engine.run([TaskRef("train", 0), TaskRef("train", 1)], 2, seed=3)
        assert "raise rollout.max_env_failures" in str(err.value)
        record_figures("HTTP shard dead for good (cap 1)", faults_injected=1, env_failures=2, rollout_stopped=True)
        client.close()
    finally:
        server.close()


@pytest.fixture(scope="module")
def ray_cluster(ray_cluster):
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[FaultEnv.__module__])
    return ray_cluster


def wait_until_dead(pid: int, timeout: float) -> None:
    """Return once process ``pid`` has exited (gone, or a zombie its parent has not reaped yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        assert time.monotonic() < deadline, f"process {pid} still runs {timeout:.0f} s after it was killed"
        time.sleep(0.05)


def test_killed_ray_pool_actor_is_restarted_and_its_episodes_rerun(tokenizer, ray_cluster):
    ray = ray_cluster
    actors = launch_ray_shards("textcraft", 4, {"max_steps": 3}, num_shards=2, num_cpus_per_shard=0.5)
    pid = ray.get(actors[1].__ray_call__.remote(lambda actor: os.getpid()))
    killed = []

    def kill_actor_1(call: int) -> None:
        if call == 1:
            ray.kill(actors[1], no_restart=False)  # the process dies; Ray starts it again (max_restarts)
            # ray.kill only asks for the kill: wait until the process is gone, or on a loaded box the
            # shard's last steps can still be answered by the old process and nothing fails
            wait_until_dead(pid, timeout=60)
            killed.append(call)

    try:
        client = EnvClient.ray_actors(actors, timeout=20)
        rollout_cfg, env_cfg = configs()
        engine = RolloutEngine(ScriptedTextBackend(tokenizer, VALID, hook=kill_actor_1), tokenizer, client,
                               rollout_cfg, env_cfg)
        tasks = [TaskRef("train", 0), TaskRef("train", 1)]
        result = engine.run(tasks, 2, seed=3)
        check_complete(result, tasks, 2)
        assert killed and result.stats["episodes_rerun"] >= 2
        record_figures("Ray env pool actor killed mid-rollout", faults_injected=1,
                       env_failures=result.stats["env_failures"], episodes_recovered=result.stats["episodes_rerun"],
                       episodes_lost=0)
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)


def test_the_group_pool_plays_an_episode_an_env_failure_ended_again_and_hands_the_group_back_whole(tokenizer, tmp_path):
    from agentrl.rollout.group_pool import GroupPool, GroupSpec

    client, pool = local_client(tmp_path, raise_step=2)
    rollout_cfg, env_cfg = configs()
    engine = RolloutEngine(ScriptedTextBackend(tokenizer, VALID), tokenizer, client, rollout_cfg, env_cfg,
                           env_name="test-fault")
    groups = GroupPool(engine, group_size=2, sampling=engine.sampling_params(seed=1), seed=1, failure_block=2)
    groups.add([GroupSpec(TaskRef("tasks", 0), 0, 0), GroupSpec(TaskRef("tasks", 1), 1, 2)])
    results = []
    while groups.busy or groups.waiting:
        results += groups.step()
    stats = groups.drain_stats()
    assert stats["env_failures"] == 1 and stats["episodes_rerun"] == 1 and pool.failures == 1
    by_group = {int(r.batch.group_id[0]): r for r in results}
    assert sorted(by_group) == [0, 1]
    for group_id, result in by_group.items():
        assert sorted(e.traj_id for e in result.episodes) == [2 * group_id, 2 * group_id + 1]
        assert all(e.won and e.env_error is None for e in result.episodes)
        rows = result.batch.traj_id.tolist()
        assert all(rows.count(e.traj_id) == e.length == 3 for e in result.episodes)
    client.close()


def test_the_group_pool_stops_past_the_failure_cap(tokenizer, tmp_path):
    from agentrl.rollout.group_pool import GroupPool, GroupSpec

    client, _ = local_client(tmp_path, raise_step=2)
    rollout_cfg, env_cfg = configs(max_env_failures=0, on_env_failure="mask")
    engine = RolloutEngine(ScriptedTextBackend(tokenizer, VALID), tokenizer, client, rollout_cfg, env_cfg,
                           env_name="test-fault")
    groups = GroupPool(engine, group_size=2, sampling=engine.sampling_params(seed=1), seed=1, failure_block=2)
    groups.add([GroupSpec(TaskRef("tasks", 0), 0, 0)])
    with pytest.raises(EnvFailureLimitError, match="more than rollout.max_env_failures=0"):
        while groups.busy or groups.waiting:
            groups.step()
    client.close()
