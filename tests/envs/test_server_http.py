"""The pool server over HTTP: batched reset/step, sharding, concurrency, bad requests, failures."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from agentrl.cli.main import main as cli_main
from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient, EnvRequestError, EnvTimeoutError
from agentrl.envs.server.http_server import ShardedHTTPServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def textcraft_server():
    server = ShardedHTTPServer("textcraft", 8, shards=2)
    server.start_background()
    yield server
    server.close()


@pytest.fixture(scope="module")
def flaky_server():
    server = ShardedHTTPServer("test-flaky", 4, max_body_bytes=4096)
    server.start_background()
    yield server
    server.close()


def url(server) -> str:
    return f"http://127.0.0.1:{server.port}"


def raw_request(server, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        if body is None and headers is None:
            conn.request(method, path)
        else:
            conn.putrequest(method, path)
            for key, value in (headers or {}).items():
                conn.putheader(key, value)
            conn.endheaders()
            if body:
                conn.send(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def post(server, path: str, payload) -> tuple[int, dict]:
    body = json.dumps(payload).encode()
    return raw_request(server, "POST", path, body, {"Content-Length": str(len(body))})


def solve(client: EnvClient, ids: list[int], tasks: list[TaskRef]) -> list:
    resets = client.reset(list(zip(ids, tasks)))
    assert all(r.ok for r in resets)
    plans = dict(zip(ids, client.expert_actions(ids)))
    last = {}
    for k in range(max(len(p) for p in plans.values())):
        batch = [(i, plans[i][k]) for i in ids if k < len(plans[i])]
        for result in client.step(batch):
            last[result.instance_id] = result
    return [last[i] for i in ids]


def test_info_lists_every_shard(textcraft_server):
    with EnvClient.http(url(textcraft_server), timeout=30) as client:
        assert client.size == 8 and client.env_name == "textcraft"
        assert [(s["first_id"], s["size"]) for s in client.info["shards"]] == [(0, 4), (4, 4)]
        assert client.split_sizes["adapt"] == 200


def test_batched_episodes_over_two_shards(textcraft_server):
    ids = [5, 0, 7, 2, 4, 1, 6, 3]  # any order: results come back in request order
    tasks = [TaskRef("depth2", i) for i in ids]
    with EnvClient.http(url(textcraft_server), timeout=30) as client:
        first = client.reset([(ids[0], tasks[0])])[0]
        assert first.obs.startswith("Crafting commands:\n") and first.info["split"] == "depth2"
        finals = solve(client, ids, tasks)
    assert [r.instance_id for r in finals] == ids
    assert all(r.ok and r.terminated and r.reward == 1.0 and r.info["won"] for r in finals)


def test_concurrent_clients(textcraft_server):
    outcomes: dict[int, list] = {}
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            with EnvClient.http(url(textcraft_server), timeout=30) as client:
                ids = [n, n + 4]  # one instance on each shard
                outcomes[n] = solve(client, ids, [TaskRef("train", 10 * n + k) for k in range(2)])
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert sorted(outcomes) == [0, 1, 2, 3]
    assert all(r.ok and r.info["won"] for results in outcomes.values() for r in results)


@pytest.mark.parametrize("payload, fragment", [
    ([1, 2], "JSON object"),
    ({"items": "x"}, "'items' must be a list"),
    ({"items": [{"instance_id": 9, "task": {"split": "tasks", "index": 0}}]}, "unknown instance id 9"),
    ({"items": [{"instance_id": True, "task": {"split": "tasks", "index": 0}}]}, "must be an integer"),
    ({"items": [{"task": {"split": "tasks", "index": 0}}]}, "no 'instance_id'"),
    ({"items": [{"instance_id": 0, "task": {"split": "tasks", "index": 0}},
                {"instance_id": 0, "task": {"split": "tasks", "index": 1}}]}, "appears twice"),
    ({"items": [{"instance_id": 0, "task": {"split": "nope", "index": 0}}]}, "unknown split 'nope'"),
    ({"items": [{"instance_id": 0, "task": {"split": "tasks", "index": 4}}]}, "out of range"),
    ({"items": [{"instance_id": 0, "task": "tasks/0"}]}, "'task' must be"),
])
def test_bad_reset_requests_get_400(flaky_server, payload, fragment):
    status, body = post(flaky_server, "/reset", payload)
    assert status == 400 and fragment in body["error"]


def test_bad_requests_get_4xx_and_the_server_lives_on(flaky_server):
    big = b"{" + b" " * 5000 + b"}"
    cases = [
        (raw_request(flaky_server, "POST", "/step", b"{not json", {"Content-Length": "9"}), 400, "not valid"),
        (raw_request(flaky_server, "POST", "/step", b"\xff\xfe", {"Content-Length": "2"}), 400, "UTF-8"),
        (post(flaky_server, "/step", {"items": [{"instance_id": 1, "action": 3}]}), 400, "must be a string"),
        (raw_request(flaky_server, "POST", "/step", big, {"Content-Length": str(len(big))}), 413, "over the limit"),
        (raw_request(flaky_server, "POST", "/step", b"", {}), 411, "Content-Length"),
        (raw_request(flaky_server, "POST", "/step", b"", {"Content-Length": "-3"}), 400, "Content-Length"),
        (raw_request(flaky_server, "GET", "/nowhere"), 404, "no route"),
        (raw_request(flaky_server, "GET", "/step"), 405, "POST"),
        (raw_request(flaky_server, "DELETE", "/step"), 405, "not supported"),
        (post(flaky_server, "/expert", {"instance_ids": 0}), 400, "instance_ids"),
    ]
    for (status, body), want_status, fragment in cases:
        assert status == want_status and fragment in body["error"], (status, body)
    assert raw_request(flaky_server, "GET", "/health") == (200, {"ok": True})


def test_client_rejects_unknown_ids_and_reports_4xx(flaky_server):
    with EnvClient.http(url(flaky_server), timeout=10) as client:
        with pytest.raises(EnvRequestError, match="unknown instance id 4"):
            client.step([(4, "win")])
        with pytest.raises(EnvRequestError, match="unknown split"):
            client.reset([(0, TaskRef("nope", 0))])
        assert client.reset([(0, TaskRef("tasks", 1))])[0].obs == "task 1"  # still usable


def test_raising_instance_is_rebuilt_and_reported(flaky_server):
    with EnvClient.http(url(flaky_server), timeout=10) as client:
        client.reset([(i, TaskRef("tasks", i)) for i in range(4)])
        failed, fine = client.step([(1, "explode"), (2, "wait")])
        assert not failed.ok and "RuntimeError: engine crashed" in failed.error
        assert "rebuilt" in failed.info["env_error"] and failed.truncated and failed.reward == 0.0
        assert failed.info["split"] == "tasks" and failed.info["index"] == 1
        assert fine.ok and fine.obs == "you did wait"
        again = client.step([(1, "win")])[0]
        assert not again.ok and "reset it first" in again.error
        assert client.reset([(1, TaskRef("tasks", 3))])[0].ok
        assert client.step([(1, "win")])[0].info["won"]
        broken = client.reset([(3, TaskRef("broken", 0))])[0]
        assert not broken.ok and "task files are missing" in broken.info["env_error"]
        assert client.reset([(3, TaskRef("tasks", 0))])[0].ok
    with EnvClient.http(url(flaky_server), timeout=10) as fresh:
        assert fresh.info["failures"] >= 2  # the server counts the failures it recovered from


def test_timeout(flaky_server):
    with EnvClient.http(url(flaky_server), timeout=10) as client:
        client.reset([(0, TaskRef("tasks", 0))])
        with pytest.raises(EnvTimeoutError):
            client.step([(0, "sleep 1.5")], timeout=0.3)
        assert client.reset([(0, TaskRef("tasks", 2))], timeout=10)[0].obs == "task 2"


def test_cli_serve_runs_and_stops():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", "envs", "serve", "textcraft",
                                "--port", "0", "--size", "2", "--env-kwargs", '{"max_steps": 7}'],
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stderr.readline()
        assert line.startswith("serving 2 x textcraft at http://127.0.0.1:"), line
        address = line.split(" at ")[1].split()[0]
        with EnvClient.http(address, timeout=30) as client:
            assert client.info["env_kwargs"] == {"max_steps": 7}
            result = client.reset([(1, TaskRef("adapt", 3))])[0]
            assert result.ok and result.info["index"] == 3
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        process.stderr.close()


@pytest.mark.parametrize("argv, fragment", [
    (["--env-kwargs", "{bad"], "not valid JSON"),
    (["--env-kwargs", "[1]"], "JSON object"),
    (["--size", "0"], "--size"),
    (["--shards", "3", "--size", "2"], "--shards"),
])
def test_cli_serve_usage_errors(capsys, argv, fragment):
    assert cli_main(["envs", "serve", "textcraft", *argv]) == 2
    assert fragment in capsys.readouterr().err
