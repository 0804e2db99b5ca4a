"""Several env servers behind one env.server_url: the spec, round-robin routing, spares per worker,
and fail-over when a server dies (real HTTP servers, one closed mid-run)."""

from __future__ import annotations

import pytest

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvServerError
from agentrl.envs.server import servers as servers_module
from agentrl.envs.server.http_server import ShardedHTTPServer
from agentrl.envs.server.servers import (ServerEntry, ServerSet, deal_round_robin, parse_server_spec,
                                         spare_ids_of_worker, spares_per_worker)
from agentrl.errors import UsageError


def test_the_spec_names_servers_by_list_or_file(tmp_path):
    assert parse_server_spec("http://10.0.0.5:8400, 10.0.0.6:8400 max=16") == [
        ServerEntry("http://10.0.0.5:8400"), ServerEntry("http://10.0.0.6:8400", 16)]
    listing = tmp_path / "servers.txt"
    listing.write_text("# the env hosts\nhttp://a:8400   # rack 1\n\nhttp://b:8401 max=8\n")
    assert parse_server_spec(f"@{listing}") == [ServerEntry("http://a:8400"), ServerEntry("http://b:8401", 8)]
    for bad, message in [("http://a:8400, http://a:8400", "more than once"), ("http://a", "expected an env server"),
                         ("http://a:1 cap=3", "the only option is max=N"), (" , ", "names no env server"),
                         (f"@{tmp_path / 'none.txt'}", "no such file")]:
        with pytest.raises(UsageError, match=message):
            parse_server_spec(bad)


def test_ids_are_dealt_round_robin_and_spares_split_between_workers():
    assert deal_round_robin([3, 1, 2]) == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (0, 2)]
    routes = deal_round_robin([5, 5])           # ids 0, 2, 4, .. on server 0; 1, 3, 5, .. on server 1
    # the spares 4..9 dealt per server, so each worker has spares on both servers (not 4, 6, 8 on one)
    assert spare_ids_of_worker(routes, 4, 0, 2) == [4, 5, 8, 9] and spare_ids_of_worker(routes, 4, 1, 2) == [6, 7]


@pytest.fixture()
def two_servers():
    started = [ShardedHTTPServer("textcraft", 4) for _ in range(2)]
    for server in started:
        server.start_background()
    yield started
    for server in started:
        server.close()


def spec_of(servers) -> str:
    return ", ".join(f"http://127.0.0.1:{s.port}" for s in servers)


def test_a_dead_server_fails_over_to_spares_and_comes_back(two_servers, monkeypatch):
    """Ids 0-3 of a worker spread over two servers (0, 2 on the first); the first server is closed:
    the reset of its ids is retried at once on the second server's spares, and the health stats say
    so; once it serves again (on its port) it is no longer down."""
    first, second = two_servers
    spares = spares_per_worker(spec_of(two_servers), 4, 1, timeout=10)
    assert spares == [[4, 5, 6, 7]]
    tasks = [(i, TaskRef("depth2", i)) for i in range(4)]
    with ServerSet.connect(parse_server_spec(spec_of(two_servers)), timeout=10, spare_ids=spares[0]) as client:
        assert [client.routes[i][0] for i in range(4)] == [0, 1, 0, 1] and client.size == 8
        assert all(r.ok for r in client.reset(tasks))
        assert all(r.ok for r in client.step([(i, "inventory") for i in range(4)]))
        port = first.port
        first.close()

        results = client.step([(i, "inventory") for i in range(4)], on_shard_error="report")
        assert [r.ok for r in results] == [False, True, False, True]      # steps on the dead server fail
        assert client.routes[0][0] == client.routes[2][0] == 1              # ... and their ids moved
        again = client.reset(tasks, on_shard_error="report")                 # the episodes re-run there
        assert all(r.ok for r in again) and [r.instance_id for r in again] == [0, 1, 2, 3]
        assert client.server_stats() == {"env_server0_failed": 2.0, "env_server0_moved": 2.0, "max_env_server0_down": 1.0,
                                         "env_server1_failed": 0.0, "env_server1_moved": 0.0, "max_env_server1_down": 0.0}
        assert client.server_stats()["env_server0_failed"] == 0.0          # counted once

        revived = ShardedHTTPServer("textcraft", 4, port=port)
        revived.start_background()
        try:
            monkeypatch.setattr(servers_module, "RECHECK_S", 0.0)
            assert client.server_stats()["max_env_server0_down"] == 0.0
        finally:
            revived.close()


def test_a_reset_on_a_server_that_died_is_retried_on_a_live_one(two_servers):
    first, _ = two_servers
    with ServerSet.connect(parse_server_spec(spec_of(two_servers)), timeout=10, spare_ids=[4, 5, 6, 7]) as client:
        first.close()
        results = client.reset([(i, TaskRef("depth2", i)) for i in range(4)], on_shard_error="report")
        assert all(r.ok for r in results)
        assert {client.routes[i][0] for i in range(4)} == {1}


def test_too_few_instances_or_a_dead_server_at_start_is_one_line(two_servers):
    with pytest.raises(UsageError, match=r"hold 6 env instances in all \(max=N applied\) but a rollout needs 7"):
        spares_per_worker(spec_of(two_servers) + " max=2", 7, 2, timeout=10)
    two_servers[1].close()
    with pytest.raises(EnvServerError, match=r"env server http://127.0.0.1:\d+ \(env.server_url\) does not answer"):
        spares_per_worker(spec_of(two_servers), 4, 2, timeout=5)
