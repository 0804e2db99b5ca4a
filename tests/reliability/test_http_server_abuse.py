"""Fault 6: the HTTP env server under many concurrent clients, with bad requests mixed in, and its
default bind address. Malformed JSON, unknown ids, oversized bodies and wrong methods are already
proven one by one in tests/envs/test_server_http.py; here they arrive together with real traffic."""

from __future__ import annotations

import http.client
import inspect
import json
import threading

import pytest

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.envs.server.http_server import ShardedHTTPServer, serve
from reliability_kit import record_figures

pytestmark = pytest.mark.slow


def test_binds_loopback_by_default():
    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    assert inspect.signature(ShardedHTTPServer).parameters["host"].default == "127.0.0.1"
    server = ShardedHTTPServer("textcraft", 2)
    try:
        assert server.server.server_address[0] == "127.0.0.1"
    finally:
        server.close()


def _bad(port: int, n: int) -> int:
    """One bad request of kind ``n % 4``; the status the server answered."""
    bodies = [b"{not json", json.dumps({"items": [{"instance_id": 999, "action": "x"}]}).encode(),
              b"x" * 5000, json.dumps({"items": "eval('1')"}).encode()]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        body = bodies[n % 4]
        conn.putrequest("POST", "/step")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        if len(body) <= 4096:  # an oversized body is refused from its header, before it is sent
            conn.send(body)
        response = conn.getresponse()
        assert "error" in json.loads(response.read())
        return response.status
    finally:
        conn.close()


def test_many_concurrent_clients_with_bad_requests_mixed_in():
    server = ShardedHTTPServer("textcraft", 16, max_body_bytes=4096)
    server.start_background()
    url = f"http://127.0.0.1:{server.port}"
    statuses: list[int] = []
    wins: list[bool] = []
    errors: list[BaseException] = []

    def good(n: int) -> None:
        try:
            with EnvClient.http(url, timeout=30) as client:
                client.reset([(n, TaskRef("train", n))])
                plan = client.expert_actions([n])[0]
                for action in plan:
                    result = client.step([(n, action)])[0]
                wins.append(bool(result.ok and result.info["won"]))
        except BaseException as err:  # noqa: BLE001 - asserted below
            errors.append(("good", n, err))

    def bad(n: int) -> None:
        try:
            statuses.append(_bad(server.port, n))
        except BaseException as err:  # noqa: BLE001
            errors.append(("bad", n, err))

    threads = [threading.Thread(target=good, args=(n,)) for n in range(16)]
    threads += [threading.Thread(target=bad, args=(n,)) for n in range(32)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        assert len(wins) == 16 and all(wins)
        assert sorted(set(statuses)) == [400, 413] and len(statuses) == 32
        with EnvClient.http(url, timeout=10) as client:  # still up and serving
            assert client.reset([(0, TaskRef("train", 1))])[0].ok
        record_figures("HTTP server: 16 concurrent clients + 32 bad requests", good_episodes_won=len(wins),
                       bad_requests=len(statuses), answered_4xx=sum(400 <= s < 500 for s in statuses),
                       server_up_after=True)
    finally:
        server.close()
