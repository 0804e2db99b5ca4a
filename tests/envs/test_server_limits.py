"""The env server's connection limits (agentrl.runtime.http_connections) and its body budget
(agentrl.envs.server.http_bodies), one at a time with small sizes: a head over the limit is answered
431 before the parser sees the rest; past the connection cap a newcomer takes the place of an idle
unauthenticated connection of the client holding the most, and is answered 503 only when every
connection is busy; unauthenticated connections are kept alive briefly; claimed-but-unsent bodies
hold no budget; bodies that each hold part of the budget never wait for each other for ever."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import urllib3

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.envs.server.http_bodies import BodyBudget
from agentrl.envs.server.pool import EnvPool
from agentrl.envs.server.pool_server import PoolHTTPServer
from agentrl.runtime.http_connections import ConnectionLimits

pytestmark = pytest.mark.slow

TOKEN = "limits-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def serve():
    servers = []

    def start(token: str | None = TOKEN, **limits) -> PoolHTTPServer:
        server = PoolHTTPServer(("127.0.0.1", 0), EnvPool("test-flaky", 4), token=token,
                                max_body_bytes=limits.pop("max_body_bytes", 1 << 20),
                                limits=ConnectionLimits(**limits))
        server.start_background()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
        server.pool.close()


def port_of(server: PoolHTTPServer) -> int:
    return server.server_address[1]


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def is_closed(sock: socket.socket, wait: float = 0.0) -> bool:
    """Whether the server closed ``sock`` (within ``wait`` seconds); replies waiting are read past."""
    sock.settimeout(max(wait, 0.01))
    try:
        while data := sock.recv(65536):
            del data
        return True
    except (socket.timeout, BlockingIOError):
        return False
    except OSError:
        return True


def timed(port: int, path: str, headers: dict | None = None, method: str = "GET", body: bytes | None = None):
    start = time.monotonic()
    response = urllib3.request(method, f"http://127.0.0.1:{port}{path}", headers=headers, body=body, timeout=10,
                               retries=False)
    return response.status, time.monotonic() - start


def test_a_head_over_the_limit_is_answered_431_and_closed(serve):
    server = serve(max_head_bytes=8 << 10)
    port = port_of(server)
    assert timed(port, "/info", {**AUTH, "X-Pad": "a" * (6 << 10)})[0] == 200       # under the limit: served
    for size in (16 << 10, 4 << 20):         # a 4 MiB header: the parser never sees past 8 KiB of it
        with connect(port) as sock:
            start = time.monotonic()
            try:
                sock.sendall(b"GET /info HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * size)
            except (BrokenPipeError, ConnectionResetError):     # closed under the sender: what we want
                pass
            reply = read_all(sock)
            elapsed = time.monotonic() - start
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431"), reply[:200]
        assert "is over 8192 bytes" in json.loads(body)["error"] and elapsed < 2.0
    assert timed(port, "/health")[0] == 200


def test_past_the_cap_a_newcomer_takes_the_place_of_the_busiest_clients_idle_connection(serve):
    server = serve(max_connections=8)
    port = port_of(server)
    hog = [connect(port, "127.0.0.2") for _ in range(6)]       # one client holds most of the cap, idle
    other = [connect(port, "127.0.0.3") for _ in range(2)]
    for sock in hog[:3] + other:                                # some made a /health call: unauthenticated
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.3)
    with EnvClient.http(f"http://127.0.0.1:{port}", timeout=5, token=TOKEN) as client:   # two newcomers
        start = time.monotonic()
        assert client.reset([(0, TaskRef("tasks", 0))])[0].ok and client.step([(0, "win")])[0].ok
        assert time.monotonic() - start < 1.0
        assert timed(port, "/health")[0] == 200
    closed = [is_closed(sock, 0.2) for sock in hog + other]
    assert sum(closed[:6]) >= 2 and not any(closed[6:]), closed     # the hog's connections gave way
    assert server.guard.evicted >= 2 and server.guard.refused == 0
    for sock in hog + other:
        sock.close()


def test_when_every_connection_is_busy_a_newcomer_is_answered_503(serve):
    server = serve(token=None, max_connections=2)
    port = port_of(server)
    with EnvClient.http(f"http://127.0.0.1:{port}", timeout=10) as client:
        client.reset([(0, TaskRef("tasks", 0)), (1, TaskRef("tasks", 1))])
    time.sleep(0.1)
    busy = []
    for instance in (0, 1):
        sock = connect(port)
        body = json.dumps({"items": [{"instance_id": instance, "action": "sleep 1.5"}]}).encode()
        sock.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        busy.append(sock)
    time.sleep(0.3)
    with connect(port) as newcomer:
        head, _, body = read_all(newcomer).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head
    assert "maximum of 2 connections" in json.loads(body)["error"] and server.guard.refused == 1
    for sock in busy:
        assert read_all(sock).startswith(b"HTTP/1.1 200")
        sock.close()


def test_unauthenticated_connections_are_kept_alive_briefly_authenticated_ones_longer(serve):
    server = serve(unproven_keep_alive_s=0.3, keep_alive_s=5.0)
    port = port_of(server)
    with connect(port) as probe, connect(port) as member:
        probe.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        member.sendall(b"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
        assert is_closed(probe, 1.5)            # closed after its 0.3 s keep-alive
        assert not is_closed(member, 1.0)       # still open


def test_claimed_but_unsent_bodies_hold_no_budget(serve, monkeypatch):
    from agentrl.envs.server import http_bodies

    monkeypatch.setattr(http_bodies, "BODY_BUDGET_BYTES", 2 << 20)
    server = serve(max_body_bytes=1 << 20)
    port = port_of(server)
    with EnvClient.http(f"http://127.0.0.1:{port}", timeout=5, token=TOKEN) as client:
        client.reset([(0, TaskRef("tasks", 0))])
        claims = []
        for _ in range(6):      # 6 MiB claimed against a 2 MiB budget, nothing sent
            sock = connect(port)
            sock.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                         + b"\r\nContent-Length: 1048576\r\n\r\n")
            claims.append(sock)
        time.sleep(0.3)
        start = time.monotonic()
        assert client.step([(0, "wait")])[0].ok
        big = json.dumps({"items": [{"instance_id": 0, "action": "win"}], "pad": "x" * (900 << 10)}).encode()
        assert timed(port, "/step", {**AUTH, "Content-Type": "application/json"}, "POST", big)[0] == 200
        assert time.monotonic() - start < 1.0
        assert server.body_budget.used == 0
        for sock in claims:
            sock.close()


def test_bodies_that_each_hold_part_of_the_budget_do_not_wait_for_each_other_for_ever():
    async def scenario() -> list[str]:
        budget, order = BodyBudget(100, overdraft=80), []
        a, b = object(), object()
        await budget.take(60, a)            # a and b each hold part of the budget and want more
        await budget.take(40, b)

        async def more(holder, name, size):
            await budget.take(size, holder)
            order.append(name)

        waiting_a = asyncio.create_task(more(a, "a", 20))   # a goes past the budget (the overdraft)
        waiting_b = asyncio.create_task(more(b, "b", 30))   # b waits: the overdraft is a's
        await asyncio.sleep(0.01)
        assert order == ["a"] and budget.used == 120 and budget.peak <= 100 + 80
        budget.give(80, a)                  # a was served: b goes on
        await asyncio.wait_for(waiting_b, 1)
        await waiting_a
        budget.give(70, b)
        assert budget.used == 0
        return order

    assert asyncio.run(scenario()) == ["a", "b"]
