"""The pool server as Ray actors: sharded batches, bad requests, raising and killed instances.

Ray keeps its default token authentication on: ``ray.init`` on one machine creates the token
itself, so nothing has to be configured and other local users cannot submit work to the cluster.
"""

from __future__ import annotations

import sys
import time

import pytest

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient, EnvRequestError, EnvServerError, EnvTimeoutError
from agentrl.envs.server.ray_pool import launch_ray_shards
from flaky_env import FlakyEnv

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster(ray_cluster):
    # the flaky env and its factory live in test modules the workers cannot import: ship them by value
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[FlakyEnv.__module__])
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray_cluster


def _make_flaky():
    return FlakyEnv(max_steps=5)


@pytest.fixture(scope="module")
def textcraft_client(ray_cluster):
    client = EnvClient.ray("textcraft", 6, num_shards=2, num_cpus_per_shard=0.5, timeout=60)
    yield client
    client.close()


def test_batched_episodes_over_two_actors(textcraft_client):
    client = textcraft_client
    assert client.size == 6 and client.split_sizes["depth3"] == 117
    ids = [4, 1, 5, 0, 3, 2]
    tasks = [TaskRef("depth3", 2 * i) for i in ids]
    resets = client.reset(list(zip(ids, tasks)))
    assert [r.info["index"] for r in resets] == [2 * i for i in ids]
    plans = dict(zip(ids, client.expert_actions(ids)))
    final = {}
    for k in range(max(map(len, plans.values()))):
        for result in client.step([(i, plans[i][k]) for i in ids if k < len(plans[i])]):
            final[result.instance_id] = result
    assert all(final[i].ok and final[i].terminated and final[i].info["won"] for i in ids)


def test_bad_requests_raise_request_errors(textcraft_client):
    with pytest.raises(EnvRequestError, match="unknown split"):
        textcraft_client.reset([(0, TaskRef("depth9", 0))])
    with pytest.raises(EnvRequestError, match="unknown instance id 6"):
        textcraft_client.step([(6, "inventory")])
    with pytest.raises(EnvRequestError, match="must be a string"):
        textcraft_client.step([(0, ["inventory"])])
    assert textcraft_client.reset([(0, TaskRef("adapt", 0))])[0].ok


@pytest.fixture(scope="module")
def flaky_actors(ray_cluster):
    actors = launch_ray_shards("test-flaky", 2, num_shards=1, num_cpus_per_shard=0.5, factory=_make_flaky)
    yield actors
    for actor in actors:
        ray.kill(actor, no_restart=True)


def test_raising_instance_is_rebuilt_and_reported(flaky_actors):
    client = EnvClient.ray_actors(flaky_actors, timeout=30)
    client.reset([(0, TaskRef("tasks", 0)), (1, TaskRef("tasks", 1))])
    failed, fine = client.step([(0, "explode"), (1, "win")])
    assert not failed.ok and "engine crashed" in failed.info["env_error"] and failed.truncated
    assert fine.ok and fine.info["won"]
    assert client.reset([(0, TaskRef("tasks", 2))])[0].obs == "task 2"
    assert client.step([(0, "win")])[0].info["won"]


def test_timeout(flaky_actors):
    client = EnvClient.ray_actors(flaky_actors, timeout=30)
    client.reset([(0, TaskRef("tasks", 0))])
    with pytest.raises(EnvTimeoutError):
        client.step([(0, "sleep 1.5")], timeout=0.3)


def test_reset_batches_get_time_per_instance_the_shard_resets(flaky_actors):
    client = EnvClient.ray_actors(flaky_actors, timeout=30)
    slow = [(0, TaskRef("slow", 0)), (1, TaskRef("slow", 1))]       # one shard loads both, 0.4 s each
    with pytest.raises(EnvTimeoutError):
        client.reset(slow, timeout=0.3)
    time.sleep(1.0)                                                 # let the abandoned call finish
    results = client.reset(slow, timeout=0.3, per_instance_s=0.5)   # 0.3 + 2 x 0.5 s
    assert [r.obs for r in results] == ["task 0", "task 1"] and all(r.ok for r in results)


def test_killed_shard_process_is_reported_then_restarted_with_fresh_instances(flaky_actors):
    client = EnvClient.ray_actors(flaky_actors, timeout=30)
    client.reset([(0, TaskRef("tasks", 0)), (1, TaskRef("tasks", 1))])
    with pytest.raises(EnvServerError, match="actor died"):
        client.step([(0, "die"), (1, "wait")])
    results = None
    for _ in range(100):  # Ray restarts the actor; calls fail until it is back
        try:
            results = client.step([(0, "win"), (1, "win")], timeout=30)
            break
        except EnvServerError:
            time.sleep(0.1)
    assert results is not None
    assert all(not r.ok and "reset it first" in r.error for r in results)
    assert client.reset([(0, TaskRef("tasks", 1))])[0].obs == "task 1"
    assert client.step([(0, "win")])[0].info["won"]
