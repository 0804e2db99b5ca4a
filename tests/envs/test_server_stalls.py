"""The HTTP env server does not stall: a slow or hung step delays only its own instances, hung calls
time out together, request heads and bodies have deadlines, bodies held at once are bounded, and a
client that disconnects mid-body costs one log line. Bounds are generous (a loaded 2-core box);
docs/reliability.md has the measured figures."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest
import urllib3

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient, EnvServerError, http_bodies
from agentrl.envs.server.http_server import ShardedHTTPServer
from agentrl.envs.server.pool import EnvPool
from agentrl.runtime import http_connections

pytestmark = pytest.mark.slow


def served(**kwargs) -> ShardedHTTPServer:
    server = ShardedHTTPServer("test-flaky", 4, **kwargs)
    server.start_background()
    return server


def timed_get(port: int, path: str) -> tuple[int, float]:
    start = time.monotonic()
    response = urllib3.request("GET", f"http://127.0.0.1:{port}{path}", timeout=10, retries=False)
    return response.status, time.monotonic() - start


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def step_quietly(client: EnvClient, items: list) -> None:
    """A step left running when its server closes (answered 503: "the server closed ...")."""
    try:
        client.step(items)
    except EnvServerError as err:
        assert "503" in str(err) or "closed" in str(err), err


def test_health_and_other_instances_answer_while_a_step_hangs():
    server = served()
    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=20) as client, \
                EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=20) as other:
            client.reset([(i, TaskRef("tasks", i)) for i in range(4)])
            hung = threading.Thread(target=step_quietly, args=(client, [(0, "sleep 4")]), daemon=True)
            hung.start()
            time.sleep(0.3)
            health = [timed_get(server.port, "/health") for _ in range(5)]
            assert all(status == 200 for status, _ in health)
            start = time.monotonic()
            result = other.step([(1, "win"), (2, "wait")])
            elapsed = time.monotonic() - start
            assert [r.ok for r in result] == [True, True] and result[0].info["won"]
            assert hung.is_alive()  # still sleeping: the answers above did not wait for it
        assert max(seconds for _, seconds in health) < 1.0 and elapsed < 1.0, (health, elapsed)
    finally:
        server.close()


def test_hung_calls_time_out_together_not_one_after_another():
    server = served(call_timeout_s=1.0)
    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=20) as client:
            client.reset([(i, TaskRef("tasks", i)) for i in range(4)])
            start = time.monotonic()
            results = client.step([(0, "sleep 6"), (1, "sleep 6"), (2, "sleep 6"), (3, "win")])
            elapsed = time.monotonic() - start
        assert [r.ok for r in results] == [False, False, False, True]
        assert all("InstanceTimeout" in r.error and "rebuilt" in r.error for r in results[:3])
        assert elapsed < 2.5, elapsed  # one after another: 3 x 1 s, and the fine step behind them
    finally:
        server.close()


def test_concurrent_requests_with_hung_instances_are_answered_together():
    server = served(call_timeout_s=1.0)
    replies: dict[int, tuple[bool, float]] = {}
    clients = [EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=20) for _ in range(4)]
    ready = threading.Barrier(4)

    def hang(i: int) -> None:
        ready.wait()
        start = time.monotonic()
        result = clients[i].step([(i, "sleep 6")])[0]
        replies[i] = (result.ok, time.monotonic() - start)

    try:
        clients[0].reset([(i, TaskRef("tasks", i)) for i in range(4)])
        threads = [threading.Thread(target=hang, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert sorted(replies) == [0, 1, 2, 3] and not any(ok for ok, _ in replies.values())
        assert max(seconds for _, seconds in replies.values()) < 2.5, replies  # one after another: 4 s
    finally:
        for client in clients:
            client.close()
        server.close()


def test_an_abandoned_call_that_returns_late_leaves_the_rebuilt_instance_alone():
    pool = EnvPool("test-flaky", 2, call_timeout_s=0.3)
    try:
        pool.handle("reset", {"items": [{"instance_id": 0, "task": {"split": "tasks", "index": 0}}]})
        status, body = pool.handle("step", {"items": [{"instance_id": 0, "action": "sleep 1"}]})
        assert status == 200 and "InstanceTimeout" in body["results"][0]["error"]
        pool.handle("reset", {"items": [{"instance_id": 0, "task": {"split": "tasks", "index": 2}}]})
        time.sleep(1.0)  # the abandoned call returns meanwhile, on its own thread
        status, body = pool.handle("step", {"items": [{"instance_id": 0, "action": "win"}]})
        assert body["results"][0]["ok"] and body["results"][0]["info"]["won"]
        assert pool.failures == 1
    finally:
        pool.close()


def test_a_request_for_a_busy_instance_waits_for_it():
    pool = EnvPool("test-flaky", 2)
    try:
        pool.handle("reset", {"items": [{"instance_id": i, "task": {"split": "tasks", "index": i}} for i in (0, 1)]})
        slow = threading.Thread(target=pool.handle, args=("step", {"items": [{"instance_id": 0,
                                                                              "action": "sleep 0.5"}]}))
        slow.start()
        time.sleep(0.1)
        status, body = pool.handle("step", {"items": [{"instance_id": 1, "action": "wait"},
                                                      {"instance_id": 0, "action": "win"}]})
        slow.join(5)
        assert [r["ok"] for r in body["results"]] == [True, True] and body["results"][1]["info"]["won"]
    finally:
        pool.close()


def test_a_slow_body_is_answered_408_and_closed(monkeypatch, caplog):
    monkeypatch.setattr(http_bodies, "BODY_TIMEOUT_S", 0.5)
    server = served()
    try:
        with connect(server.port) as sock:
            sock.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"items\": ")
            sock.settimeout(5)
            start = time.monotonic()
            reply = read_until_closed(sock)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and "did not arrive within 0.5 s" in json.loads(body)["error"]
        assert time.monotonic() - start < 3.0
        assert timed_get(server.port, "/health")[0] == 200
    finally:
        server.close()


def test_slow_or_missing_request_heads_are_closed(monkeypatch):
    monkeypatch.setattr(http_connections, "HEAD_TIMEOUT_S", 0.5)
    server = served()
    try:
        with connect(server.port) as idle, connect(server.port) as trickle:
            trickle.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\n")  # and never the rest
            idle.settimeout(5)
            trickle.settimeout(5)
            start = time.monotonic()
            assert read_until_closed(idle) == b""  # nothing asked, nothing answered
            head, _, body = read_until_closed(trickle).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408") and "request head" in json.loads(body)["error"]
            assert time.monotonic() - start < 3.0
        with EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=10) as client:  # real clients unharmed
            assert client.reset([(0, TaskRef("tasks", 1))])[0].ok
    finally:
        server.close()


def test_a_disconnect_mid_body_is_one_log_line(caplog):
    server = served()
    try:
        with caplog.at_level(logging.DEBUG):
            for _ in range(5):
                with connect(server.port) as sock:
                    sock.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"items\": [")
                    time.sleep(0.05)
            deadline = time.monotonic() + 5
            while len(caplog.records) < 5 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)
        lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(lines) == 5, [r.getMessage() for r in lines]
        assert all(r.exc_info is None and "disconnected" in r.getMessage() for r in lines)
        assert timed_get(server.port, "/health")[0] == 200
    finally:
        server.close()


def test_bodies_held_at_once_stay_within_the_budget(monkeypatch):
    monkeypatch.setattr(http_bodies, "BODY_BUDGET_BYTES", 2 << 20)
    server = ShardedHTTPServer("test-flaky", 4, max_body_bytes=1 << 20)
    server.start_background()
    big = json.dumps({"items": [{"instance_id": 0, "action": "wait"}], "pad": [0] * 450_000},
                     separators=(",", ":")).encode()
    assert 0.8 * (1 << 20) < len(big) < (1 << 20)
    statuses: list[int] = []

    def send() -> None:
        response = urllib3.request("POST", f"http://127.0.0.1:{server.port}/step", body=big, timeout=30,
                                   retries=False, headers={"Content-Type": "application/json"})
        statuses.append(response.status)

    try:
        with EnvClient.http(f"http://127.0.0.1:{server.port}", timeout=10) as client:
            client.reset([(0, TaskRef("tasks", 0))])
        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        health = []
        while any(t.is_alive() for t in threads):
            health.append(timed_get(server.port, "/health")[1])
            time.sleep(0.02)
        for thread in threads:
            thread.join(30)
        assert statuses == [200] * 8
        budget = server.server.body_budget
        assert budget.peak <= (2 << 20) + (1 << 20) and budget.used == 0   # the budget + one body over it
        assert max(health) < 1.0, max(health)
    finally:
        server.close()


def test_an_unclosed_pool_is_freed_with_its_threads():
    """The watchdog and the pool threads hold no strong reference to the pool: one dropped without
    close() is collected and its threads end (tests and tools drop pools all the time)."""
    import gc
    import weakref

    pool = EnvPool("test-flaky", 2, call_timeout_s=0.5)
    pool.handle("reset", {"items": [{"instance_id": 0, "task": {"split": "tasks", "index": 0}}]})
    pool.handle("step", {"items": [{"instance_id": 0, "action": "sleep 0.1"}]})  # handed to a pool thread
    threads = {t for t in threading.enumerate() if t.name.startswith("env-pool")}
    ref = weakref.ref(pool)
    del pool
    gc.collect()
    assert ref() is None
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.is_alive() for t in threads)
