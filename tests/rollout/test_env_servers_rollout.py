"""Rollout workers on several env servers (env.server_url with a comma): a server that dies between
two rollouts costs no episode: the episodes it failed are re-run on the spares of the live one, and
the per-server health reaches the iteration's metrics."""

from __future__ import annotations

import pytest

from agentrl.envs import TaskRef
from agentrl.envs.server.http_server import ShardedHTTPServer
from agentrl.rollout.worker_group import RolloutWorkerGroup
from agentrl.training.metrics import episode_metrics
from rollout_helpers import env_config, rollout_config

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def test_a_server_that_dies_between_rollouts_loses_no_episode(ray_cluster, tiny_model_dir):
    servers = [ShardedHTTPServer("textcraft", 6) for _ in range(2)]
    for server in servers:
        server.start_background()
    try:
        spec = ", ".join(f"http://127.0.0.1:{s.port}" for s in servers)
        env_cfg = env_config("textcraft", max_steps=2, group_size=2, tasks_per_iteration=2, step_timeout_s=10)
        cfg = rollout_config(max_response_tokens=6, max_prompt_tokens=1024, prompt_truncation="left")
        tasks = [TaskRef("depth2", 1), TaskRef("depth2", 2)]
        with RolloutWorkerGroup(tiny_model_dir, cfg, env_cfg, num_workers=2, worker_num_cpus=0.5,
                                env_url=spec) as group:
            first = group.run(tasks, group_size=2, seed=1)
            assert len(first.episodes) == 4 and first.stats.get("env_failures", 0) == 0
            assert episode_metrics(first)["env/server0_down"] == 0.0
            servers[0].close()
            second = group.run(tasks, group_size=2, seed=2)
            assert len(second.episodes) == 4 and all(e.env_error is None for e in second.episodes)
            metrics = episode_metrics(second)
            assert metrics["env/server0_down"] == 1.0 and metrics["env/server1_down"] == 0.0
            # each worker had two instances, one on each server: both lost one and moved it
            assert metrics["env/server0_moved"] == 2.0 and metrics["env/server0_failed"] >= 2.0
    finally:
        for server in servers:
            server.close()
