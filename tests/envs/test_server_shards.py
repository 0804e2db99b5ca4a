"""The shards of one env server live and die together, so no half-server answers: the extra shard
processes stop when the server's main process is SIGKILLed; a shard that dies and may not (or can no
longer) be started again stops the whole server, with one line naming it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from agentrl.envs.server import http_server
from agentrl.envs.server.http_server import ShardedHTTPServer

pytestmark = pytest.mark.slow


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def wait_until(condition, timeout: float) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - start


def test_the_extra_shards_stop_when_the_servers_main_process_is_killed():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    server = subprocess.Popen([sys.executable, "-c", "import sys; from agentrl.envs.server.http_server import serve; "
                               "sys.exit(serve('textcraft', 4, port=0, shards=2))"],
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = server.stderr.readline()
        ports = [int(p) for p in re.findall(r"on port (\d+)", line)]
        assert len(ports) == 2 and all(answers(p) for p in ports), line
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        gone_after = wait_until(lambda: not answers(ports[1]), 10.0)   # before: served on, a half-server
        assert gone_after < 5.0
    finally:
        if server.poll() is None:
            server.kill()
        server.stderr.close()


@pytest.mark.parametrize("restart_shards, max_restarts", [(False, 5), (True, 1)])
def test_a_shard_that_is_not_started_again_stops_the_whole_server(monkeypatch, capsys, restart_shards, max_restarts):
    monkeypatch.setattr(http_server, "MAX_RESTARTS", max_restarts)
    server = ShardedHTTPServer("textcraft", 4, shards=2, restart_shards=restart_shards)
    server.start_background()
    try:
        for death in range(1 if not restart_shards else max_restarts + 1):
            child = server.children[0]
            wait_until(lambda: answers(server.shards[1]["port"]), 30.0)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            if death < max_restarts and restart_shards:     # started again on its port
                wait_until(lambda: server.children[0] is not child, 10.0)
        wait_until(lambda: server.failure is not None and not answers(server.port), 10.0)
        assert not answers(server.shards[1]["port"])     # before: shard 0 served on, a half-server
        assert f"env shard 1 (port {server.shards[1]['port']}) exited with code -9" in server.failure
        err = capsys.readouterr().err
        assert "env server stopped:" in err and "the other shards are stopped with it" in err
        assert server.restarts == (max_restarts if restart_shards else 0)
    finally:
        server.close()
