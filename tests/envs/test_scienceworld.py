"""ScienceWorld on its engine: the splits are the engine's, agentrl passes the engine's replies through
unchanged and matches an engine called directly, gold paths score 100, the protocol's info keys.

Each environment instance starts a JVM (about 1.5 s; Java 17 and ``scienceworld`` 1.2.3 needed:
scripts/setup.sh installs both)."""

from __future__ import annotations

import json
import shutil

import pytest

from agentrl.envs import REQUIRED_INFO_KEYS, TaskRef
from agentrl.envs.spec import env_spec

pytest.importorskip("scienceworld")
if shutil.which("java") is None:
    pytest.skip("ScienceWorld needs Java 17 (apt-get install openjdk-17-jre-headless)", allow_module_level=True)

from agentrl_env_scienceworld.check import gold_episodes, identity_episodes  # noqa: E402
from agentrl_env_scienceworld.engine import start_engine  # noqa: E402
from agentrl_env_scienceworld.tasks import SETS, build_table, split_table, splits  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env():
    instance = env_spec("scienceworld").make_env(max_steps=100)
    yield instance
    instance.close()


@pytest.fixture(scope="module")
def engines():
    pair = (start_engine(), start_engine())
    yield pair
    for engine in pair:
        engine.close()


def test_splits_are_the_engines_variation_sets(engines):
    assert build_table(engines[0]) == split_table()
    table = split_table()
    assert len(table) == 30
    # the paper's counts: 3,592 train, 1,796 dev and 1,819 test variations
    assert {name: sum(len(sets[name]) for sets in table.values()) for name in SETS} == {
        "train": 3592, "dev": 1796, "test": 1819}
    test = splits()["test"]
    assert [task_type for task_type, _ in test[:30]] == list(table)  # round-robin over the task types
    assert test[30] == ("boil", table["boil"]["test"][1])
    assert splits()["test_melt"] == tuple(("melt", v) for v in table["melt"]["test"])


def test_identical_to_the_engine_called_directly(env, engines):
    # every task type once (the first 30 test tasks), random valid actions: the same observation,
    # score, reward, done and valid actions as an engine of its own, and as what env's own engine returned
    summary = identity_episodes(env, engines[0], engines[1], "test", episodes=30, steps=2, seed=3)
    assert summary["task_types"] == 30 and summary["steps"] >= 55
    assert summary["passthrough_problems"] == 0, summary["first_passthrough_differences"]
    assert summary["differ"] == 0 and summary["engine_self_differ"] == 0, \
        summary["first_differences_where_engines_agree"]


def test_gold_paths_score_100(env):
    for split in ("test_find-non-living-thing", "test_chemistry-mix-paint-secondary-color",
                  "dev_lifespan-shortest-lived"):
        result = gold_episodes(env, split, 1)
        assert result["won"] == 1, result


def test_protocol_reward_is_the_score_change(env):
    obs, info = env.reset(TaskRef("test_chemistry-mix-paint-secondary-color", 0))
    assert set(REQUIRED_INFO_KEYS) <= set(info) and info["task_type"] == "chemistry-mix-paint-secondary-color"
    assert info["task"].startswith("Your task is to") and obs.startswith("This room is called")
    assert len(info["admissible_actions"]) > 50 and "look around" in info["admissible_actions"]
    json.dumps(info)
    start_score = info["task_score"]  # this task gives part of its score at the start
    _, reward, terminated, _, info = env.step("dance wildly")
    assert (reward, terminated, info["noop"], info["task_score"]) == (0.0, False, True, start_score)
    env.reset(TaskRef("test_chemistry-mix-paint-secondary-color", 0))
    plan = env.expert_actions()  # reloads the task with its gold path: the reset state again
    total, score_before = float(start_score), start_score
    for action in plan:
        _, reward, terminated, truncated, info = env.step(action)
        assert reward == info["task_score"] - score_before and info["noop"] is False
        total, score_before = total + reward, info["task_score"]
    assert terminated and info["won"] and total == 100 == info["task_score"]


def test_expert_only_from_the_reset_state_and_truncation():
    short = env_spec("scienceworld").make_env(max_steps=2)
    try:
        short.reset(TaskRef("dev_find-plant", 0))
        flags = [short.step("look around")[2:4] for _ in range(2)]
        assert flags == [(False, False), (False, True)]
        with pytest.raises(RuntimeError, match="call it before step"):
            short.expert_actions()
    finally:
        short.close()


def test_served_over_http():
    from agentrl.envs.server import EnvClient
    from agentrl.envs.server.http_server import ShardedHTTPServer

    server = ShardedHTTPServer("scienceworld", 2, env_kwargs={"max_steps": 30})
    server.start_background()
    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=120) as client:
            assert client.env_name == "scienceworld" and client.split_sizes["test"] == 1819
            tasks = [TaskRef("test_find-non-living-thing", 0), TaskRef("test_lifespan-longest-lived", 0)]
            resets = client.reset(list(zip([0, 1], tasks)))
            assert [r.info["task_type"] for r in resets] == ["find-non-living-thing", "lifespan-longest-lived"]
            plans = dict(zip([0, 1], client.expert_actions([0, 1])))
            final = {}
            for k in range(max(map(len, plans.values()))):
                for result in client.step([(i, plans[i][k]) for i in (0, 1) if k < len(plans[i])]):
                    final[result.instance_id] = result
    finally:
        server.close()
    assert all(final[i].ok and final[i].terminated and final[i].info["won"] for i in (0, 1))
    assert all(final[i].info["task_score"] == 100 for i in (0, 1))
