"""The HTTP env server's published API (OpenAPI document, /docs page) matches what it serves, and
the server/client stack behaves as documented: JSON answers to malformed HTTP, keep-alive through
the client's connection pool, stale connections replaced, /health answered during a slow step."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import urllib3

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient, EnvServerError, api, pool_server
from agentrl.envs.server.http_server import ShardedHTTPServer
from agentrl.runtime import http_connections

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ROUTES = {("/health", "get"), ("/info", "get"), ("/reset", "post"), ("/step", "post"), ("/expert", "post"),
          ("/openapi.json", "get"), ("/docs", "get")}


@pytest.fixture(scope="module")
def server():
    server = ShardedHTTPServer("test-flaky", 4, max_body_bytes=4096)  # registered in this process only
    server.start_background()
    yield server
    server.close()


@pytest.fixture(scope="module")
def sharded():
    server = ShardedHTTPServer("textcraft", 4, shards=2)
    server.start_background()
    yield server
    server.close()


def get(port: int, path: str) -> urllib3.BaseHTTPResponse:
    return urllib3.request("GET", f"http://127.0.0.1:{port}{path}", timeout=10, retries=False)


def post(port: int, path: str, payload) -> tuple[int, dict]:
    response = urllib3.request("POST", f"http://127.0.0.1:{port}{path}", body=json.dumps(payload).encode(),
                               headers={"Content-Type": "application/json"}, timeout=10, retries=False)
    return response.status, response.json()


def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_openapi_document_lists_every_route_and_resolves(server):
    response = get(server.port, "/openapi.json")
    assert response.status == 200 and response.headers["content-type"] == "application/json"
    document = response.json()
    assert document["openapi"].startswith("3.1") and document["info"]["version"] == api.API_VERSION
    assert {(path, method) for path, ops in document["paths"].items() for method in ops} == ROUTES
    schemas = document["components"]["schemas"]
    refs = set()

    def collect(node) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"])
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(document)
    assert refs and all(ref.removeprefix("#/components/schemas/") in schemas for ref in refs)
    step = document["paths"]["/step"]["post"]
    assert step["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/StepRequest")
    assert {"200", "400", "405", "411", "413", "500"} <= set(step["responses"])
    assert set(schemas["StepReplyItem"]["required"]) >= {"instance_id", "ok", "error", "obs", "reward",
                                                          "terminated", "truncated", "info"}


def test_the_committed_openapi_copy_is_current():
    committed = json.loads((ROOT / "docs" / "env-server-openapi.json").read_text())
    assert committed == api.openapi_document(), "regenerate: python -m agentrl.envs.server.api > " \
                                                "docs/env-server-openapi.json"


def test_docs_page_is_self_contained(server):
    response = get(server.port, "/docs")
    page = response.data.decode()
    assert response.status == 200 and response.headers["content-type"].startswith("text/html")
    assert "<script" not in page and "/openapi.json" in page
    for path, method in ROUTES:
        assert f"{method.upper()} {path}" in page


def test_real_replies_match_the_published_schemas(server):
    info = get(server.port, "/info").json()
    api.InfoReply.model_validate(info, strict=True)
    assert info["shards"] == [{"port": server.port, "first_id": 0, "size": 4}]
    api.HealthReply.model_validate(get(server.port, "/health").json(), strict=True)
    status, body = post(server.port, "/reset", {"items": [{"instance_id": 0, "task": {"split": "tasks", "index": 1}},
                                                         {"instance_id": 1, "task": {"split": "broken", "index": 0}}]})
    assert status == 200 and [r["ok"] for r in body["results"]] == [True, False]
    api.ResetReply.model_validate(body, strict=True)
    status, body = post(server.port, "/step", {"items": [{"instance_id": 0, "action": "win"},
                                                        {"instance_id": 1, "action": "win"}]})
    assert status == 200 and [r["ok"] for r in body["results"]] == [True, False]
    api.StepReply.model_validate(body, strict=True)
    status, body = post(server.port, "/expert", {"instance_ids": [0, 1]})
    api.ExpertReply.model_validate(body, strict=True)
    for status, body in [post(server.port, "/step", {"items": 1}), post(server.port, "/nowhere", {})]:
        assert 400 <= status < 500
        api.ErrorReply.model_validate(body, strict=True)


@pytest.mark.parametrize("request_bytes", [
    b"NOT AN HTTP REQUEST\r\n\r\n",
    b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n",
    b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
])
def test_malformed_http_is_answered_400_json_and_closed(server, request_bytes):
    reply = raw(server.port, request_bytes)  # returns only once the server closed the connection
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower()
    assert "malformed HTTP request" in json.loads(body)["error"]
    assert get(server.port, "/health").status == 200


def test_client_keeps_one_connection_per_shard(sharded):
    with EnvClient.http(f"http://127.0.0.1:{sharded.port}", timeout=10) as client:
        for n in range(5):
            client.reset([(0, TaskRef("train", n)), (3, TaskRef("train", n))])
            client.step([(0, "inventory"), (3, "inventory")])
        pools = [transport._http for _, _, transport in client._shards]
        assert all(isinstance(p, urllib3.HTTPConnectionPool) for p in pools)
        assert [p.num_requests for p in pools] == [10, 10]
        assert [p.num_connections for p in pools] == [1, 1]  # keep-alive: one TCP connection each


def test_connection_closed_by_the_server_is_replaced(monkeypatch):
    monkeypatch.setattr(http_connections, "KEEP_ALIVE_S", 0.2)
    server = ShardedHTTPServer("test-flaky", 2)
    server.start_background()
    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=10) as client:
            assert client.reset([(0, TaskRef("tasks", 0))])[0].ok
            time.sleep(0.6)  # the server closed the idle connection meanwhile
            assert client.step([(0, "win")])[0].info["won"]  # a step is never re-sent: it got a fresh one
            time.sleep(0.6)
            assert client.reset([(1, TaskRef("tasks", 1))])[0].ok
    finally:
        server.close()


def test_health_and_info_answer_while_a_reset_runs(server):
    with EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=10) as client:
        slow = threading.Thread(target=client.reset, args=([(2, TaskRef("slow", 0)), (3, TaskRef("slow", 1))],))
        slow.start()  # 2 x 0.4 s of game loading, on a worker thread
        time.sleep(0.2)
        start = time.monotonic()
        assert get(server.port, "/health").status == 200
        assert get(server.port, "/info").json()["size"] == 4
        assert time.monotonic() - start < 0.4  # not queued behind the resets
        slow.join(10)


def test_a_hung_step_does_not_keep_the_server_from_closing():
    server = ShardedHTTPServer("test-flaky", 2)
    server.start_background()
    client = EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=10)
    client.reset([(0, TaskRef("tasks", 0))])
    errors: list[Exception] = []

    def hung_step() -> None:
        try:
            client.step([(0, "sleep 5")])
        except EnvServerError as err:
            errors.append(err)

    stepping = threading.Thread(target=hung_step, daemon=True)
    stepping.start()
    time.sleep(0.3)
    monitor = threading.Thread(target=server.server.shutdown, kwargs={"timeout": 1.0})
    start = time.monotonic()
    monitor.start()
    monitor.join(5)
    assert not monitor.is_alive() and time.monotonic() - start < 4  # the step runs on a daemon thread
    stepping.join(5)
    assert len(errors) == 1 and "503" in str(errors[0]) and "reset them" in str(errors[0])
    server.server.server_close()
    client.close()


def test_replies_do_not_wait_for_delayed_acks_on_the_asyncio_loop(monkeypatch):
    """Without TCP_NODELAY on accepted sockets (asyncio sets it only where uvloop would) every reply,
    written as head and body apart, waited ~40 ms for the client's delayed ACK: 250 steps/s."""
    monkeypatch.setattr(pool_server, "EVENT_LOOP", "asyncio")
    server = ShardedHTTPServer("test-flaky", 2)
    server.start_background()
    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=10) as client:
            start = time.monotonic()
            for _ in range(20):
                client.reset([(0, TaskRef("tasks", 2)), (1, TaskRef("tasks", 3))])
            assert time.monotonic() - start < 0.4  # 20 x 40 ms = 0.8 s with the stalls
    finally:
        server.close()
