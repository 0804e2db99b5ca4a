"""Sokoban served by the env servers: the HTTP pool server (two shards) and the Ray pool (two actors)
play the expert's solutions of a batch of rooms to the end."""

from __future__ import annotations

import pytest

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.envs.server.http_server import ShardedHTTPServer

pytestmark = pytest.mark.slow


def play_expert(client: EnvClient, ids: list[int], tasks: list[TaskRef]) -> dict:
    resets = client.reset(list(zip(ids, tasks)))
    assert all(r.ok and r.info["task_type"] == "6x6_1box" for r in resets)
    plans = dict(zip(ids, client.expert_actions(ids)))
    final = {}
    for k in range(max(map(len, plans.values()))):
        for result in client.step([(i, plans[i][k]) for i in ids if k < len(plans[i])]):
            final[result.instance_id] = result
    return final


def test_served_over_http():
    server = ShardedHTTPServer("sokoban", 4, env_kwargs={"max_steps": 15}, shards=2)
    server.start_background()
    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=60) as client:
            assert client.env_name == "sokoban" and client.split_sizes == {"train": 20000, "dev": 1000, "test": 1000}
            ids = [3, 0, 2, 1]
            final = play_expert(client, ids, [TaskRef("test", 10 + i) for i in ids])
    finally:
        server.close()
    assert all(final[i].ok and final[i].terminated and final[i].info["won"] for i in ids)
    assert all(final[i].reward == pytest.approx(10.9) for i in ids)  # the last push: -0.1 + 1 + 10


def test_served_by_ray_actors(ray_cluster):
    client = EnvClient.ray("sokoban", 4, num_shards=2, num_cpus_per_shard=0.5, timeout=60)
    try:
        ids = [1, 3, 0, 2]
        final = play_expert(client, ids, [TaskRef("dev", 2 * i) for i in ids])
    finally:
        client.close()
    assert all(final[i].ok and final[i].terminated and final[i].info["won"] for i in ids)
