"""Attacks on agentrl's HTTP servers from outside, and a legitimate client measured meanwhile (the
tooling of ``agentrl bench hardening`` and ``tests/reliability/test_adversarial_clients.py``).

A server is started in a process of its own from a source tree (this one, or a checkout of an older
commit, so the same attacks run against the code before a change): an env server
(``agentrl.envs.server.http_server.serve`` with a token) or an agent gateway over a labelled test
backend (fixed ids, not a model), optionally under a lowered file limit. The attacks:

* :class:`IdleConnections`: connections that send nothing, make one ``GET /health``, or are answered
  401, and are then held open;
* :class:`HugeHeads`: request heads with one header of many MiB;
* :class:`ClaimedBodies`: authenticated ``POST /step`` heads that claim a 16 MiB body and send none;
* :class:`HugeRequest`: one gateway request of many MiB with a valid episode key.

:class:`Watch` probes ``/health`` every 20 ms, runs a legitimate client (env episodes of a reset and
steps, re-run when a call fails, or small chat calls) and samples the server's memory; its figures
are the p50/p99/max latencies, the failed calls, the episodes lost and the memory growth.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
import urllib3

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient

TOKEN = "adversarial-clients-token-0123456789"
CORPUS = ["You craft items. Goal: craft a stick. Inventory: 4 oak planks, a crafting table."] * 20

_ENV_SERVER = """
import os, sys
from agentrl.envs.server.http_server import serve
sys.exit(serve({env!r}, {size}, port=0, shards={shards}, token=os.environ["AGENTRL_ENV_TOKEN"]))
"""

_GATEWAY = """
import json, sys
from agentrl.gateway.server import Gateway
from agentrl.models import train_tokenizer
from agentrl.generation.base import Generation, GenerationBackend

class Fixed(GenerationBackend):
    name = "fixed ids (attack bench, not a model)"

    def generate(self, prompts, sampling):
        return [Generation([5, 6], [0.0, 0.0], "stop") for _ in prompts]

    def load_weights(self, state_dict):
        raise NotImplementedError

tokenizer = train_tokenizer({corpus!r}, vocab_size=300)
gateway = Gateway(Fixed(), tokenizer, max_model_len=4096, default_max_tokens=8, max_prompt_tokens=3000)
gateway.start_background()
print(json.dumps({{"port": gateway.port, "keys": [gateway.open_episode().key for _ in range(2)]}}), flush=True)
sys.stdin.read()
"""


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


@dataclass
class Served:
    """A server process started from ``tree``: its ports (shard 0 first), its episode keys (gateway)."""

    kind: str
    process: subprocess.Popen
    ports: list[int]
    keys: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.ports[0]

    def rss(self) -> int:
        try:
            return psutil.Process(self.process.pid).memory_info().rss
        except psutil.Error:
            return 0

    def stop(self) -> None:
        if self.process.poll() is None:
            if self.kind == "gateway":
                self.process.stdin.close()
            else:
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


def _spawn(tree: str, code: str, file_limit: int | None) -> subprocess.Popen:
    """``code`` run by this Python with ``tree`` first on its path (its working directory: ``-c`` puts
    that first), under ``file_limit`` open files when given."""
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1", "AGENTRL_ENV_TOKEN": TOKEN}

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (file_limit, file_limit))

    return subprocess.Popen([sys.executable, "-c", code], cwd=tree, env=env, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=limit if file_limit else None)


def _drain(pipe) -> None:
    threading.Thread(target=lambda: [None for _ in pipe], daemon=True).start()


def start_env_server(tree: str, file_limit: int | None = None, size: int = 8, shards: int = 1,
                     env: str = "textcraft") -> Served:
    process = _spawn(tree, _ENV_SERVER.format(env=env, size=size, shards=shards), file_limit)
    line = process.stderr.readline()
    ports = [int(port) for port in re.findall(r" on port (\d+)", line)]
    if len(ports) != shards:
        process.send_signal(signal.SIGTERM)     # it stops its shards with it
        process.wait(15)
        raise RuntimeError(f"the env server from {tree} did not start: {line}{process.stderr.read()[-2000:]}")
    _drain(process.stderr)
    return Served("env", process, ports)


def start_gateway(tree: str, file_limit: int | None = None) -> Served:
    process = _spawn(tree, _GATEWAY.format(corpus=CORPUS), file_limit)
    line = process.stdout.readline()
    if not line.startswith("{"):
        process.kill()
        raise RuntimeError(f"the gateway from {tree} did not start: {line}{process.stderr.read()[-2000:]}")
    _drain(process.stderr)
    reply = json.loads(line)
    return Served("gateway", process, [reply["port"]], reply["keys"])


# ----- attacks -----------------------------------------------------------------------------------
class Attack:
    """Holds what it opened until :meth:`stop`; ``outcome``: what the server answered it."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.outcome: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, what: str) -> None:
        with self._lock:
            self.outcome[what] = self.outcome.get(what, 0) + 1

    def connect(self, port: int, timeout: float = 5.0) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except OSError:
            self.count("connect failed")
            return None
        with self._lock:
            self.sockets.append(sock)
        return sock

    def start(self, served: Served) -> "Attack":
        for thread in self.threads:
            thread.start()
        return self

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        for sock in self.sockets:
            try:
                sock.close()
            except OSError:
                pass
        self.wait(10.0)


def _status(reply: bytes) -> str:
    return reply[:12].decode("latin-1").strip() or "closed without a reply"


class IdleConnections(Attack):
    """``count`` connections: a third send nothing, a third make one ``GET /health``, a third one
    ``GET /info`` without the token (401); all are held open."""

    def __init__(self, count: int):
        super().__init__()
        self.count_wanted = count

    def start(self, served: Served) -> "Attack":
        requests = [b"", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n"]
        for n in range(self.count_wanted):
            sock = self.connect(served.port, timeout=2.0)
            if sock is not None and requests[n % 3]:
                try:
                    sock.sendall(requests[n % 3])
                    self.count("opened")
                except OSError:
                    self.count("reset")
            elif sock is not None:
                self.count("opened")
        return self


class HugeHeads(Attack):
    """``count`` concurrent request heads, each with one header of ``size`` bytes."""

    def __init__(self, count: int, size: int):
        super().__init__()
        self.threads = [threading.Thread(target=self._send, daemon=True) for _ in range(count)]
        self.size = size

    def start(self, served: Served) -> "Attack":
        self.port = served.port
        return super().start(served)

    def _send(self) -> None:
        sock = self.connect(self.port, timeout=120.0)
        if sock is None:
            return
        piece = b"a" * (256 << 10)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ")
            for _ in range(self.size // len(piece)):
                sock.sendall(piece)
            sock.sendall(b"\r\n\r\n")
        except OSError:
            pass                    # closed under the sender
        try:
            self.count(_status(sock.recv(64)))
        except OSError:
            self.count("closed without a reply")


class ClaimedBodies(Attack):
    """``count`` authenticated ``POST /step`` heads claiming ``claimed`` bytes of body, none sent."""

    def __init__(self, count: int, claimed: int = 16 << 20):
        super().__init__()
        self.count_wanted, self.claimed = count, claimed

    def start(self, served: Served) -> "Attack":
        head = (f"POST /step HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {self.claimed}\r\n\r\n").encode()
        for _ in range(self.count_wanted):
            sock = self.connect(served.port)
            if sock is not None:
                sock.sendall(head)
                self.count("sent")
        return self


class HugeRequest(Attack):
    """One gateway chat request of ``size`` bytes (one user message of words) with a valid episode key."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size
        self.threads = [threading.Thread(target=self._send, daemon=True)]
        self.seconds = float("nan")

    def start(self, served: Served) -> "Attack":
        self.url, self.key = f"http://127.0.0.1:{served.port}/v1/chat/completions", served.keys[0]
        return super().start(served)

    def _send(self) -> None:
        text = ("craft a stick from planks " * (self.size // 26 + 1))[:self.size]
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
        start = time.monotonic()
        try:
            response = urllib3.request("POST", self.url, body=body, timeout=600, retries=False,
                                       headers={"Authorization": f"Bearer {self.key}",
                                                "Content-Type": "application/json"})
            self.count(f"HTTP {response.status}")
        except urllib3.exceptions.HTTPError as err:
            self.count(type(err).__name__)
        self.seconds = time.monotonic() - start


# ----- the legitimate side -----------------------------------------------------------------------
class Watch:
    """While an attack runs: ``/health`` every 20 ms, a legitimate client (env episodes or chat calls)
    and the server's memory every 50 ms (:meth:`figures`)."""

    def __init__(self, served: Served, call_timeout: float = 5.0):
        self.served, self.call_timeout = served, call_timeout
        self.health: list[float] = []
        self.calls: list[float] = []
        self.failures = {"health": 0, "calls": 0}
        self.episodes = {"started": 0, "completed": 0, "rerun": 0}
        self.rss: list[int] = []
        self._stop = threading.Event()
        self._abandon = threading.Event()      # past the drain: the client gives up its episodes
        self._threads = [threading.Thread(target=target, daemon=True)
                         for target in (self._probe, self._memory,
                                        self._play if served.kind == "env" else self._chat)]

    def start(self) -> "Watch":
        self.rss.append(self.served.rss())
        for thread in self._threads:
            thread.start()
        return self

    def _timed(self, out: list[float], kind: str, call) -> Any:
        start = time.monotonic()
        try:
            result = call()
        except Exception:  # noqa: BLE001 - a failed call is counted, never raised
            self.failures[kind] += 1
            out.append(time.monotonic() - start)
            return None
        out.append(time.monotonic() - start)
        return result

    def _probe(self) -> None:
        """``GET /health`` on a new connection each time, as a load balancer probes."""
        def probe() -> bytes:
            with socket.create_connection(("127.0.0.1", self.served.port), timeout=self.call_timeout) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return sock.recv(64)

        while not self._stop.is_set():
            reply = self._timed(self.health, "health", probe)
            if reply is not None and not reply.startswith(b"HTTP/1.1 200"):
                self.failures["health"] += 1
            self._stop.wait(0.02)

    def _memory(self) -> None:
        while not self._stop.wait(0.05):
            self.rss.append(self.served.rss())

    def _play(self) -> None:
        """Episodes of a reset and three steps on an instance of the first and the last shard, each with a
        client of its own (new connections, as rollout workers make when kept ones were closed); a failed
        call fails the episode, which is played again."""
        client, pending, round_no = None, [], 0
        while not self._abandon.is_set():
            if not pending:                 # a new episode, with a new client
                if client is not None:
                    client.close()
                    client = None
                if self._stop.is_set():
                    break
            if client is None:
                client = self._timed(self.calls, "calls", lambda: EnvClient.http(
                    f"http://127.0.0.1:{self.served.port}", timeout=self.call_timeout, token=TOKEN))
                if client is None:
                    time.sleep(0.05)
                    continue
            if not pending:
                pending = [0, client.size - 1]
                self.episodes["started"] += len(pending)
            round_no += 1
            results = self._timed(self.calls, "calls", lambda: client.reset(
                [(i, TaskRef("train", round_no % 8)) for i in pending], on_shard_error="report"))
            live = [r.instance_id for r in results or [] if r.ok]
            for _ in range(3):
                if not live:
                    break
                results = self._timed(self.calls, "calls", lambda: client.step(
                    [(i, "inventory") for i in live], on_shard_error="report"))
                live = [r.instance_id for r in results or [] if r.ok]
            failed = [i for i in pending if i not in set(live)]
            self.episodes["completed"] += len(pending) - len(failed)
            self.episodes["rerun"] += len(failed)
            pending = failed
            if failed:
                time.sleep(0.05)        # a shard may be starting again: not a busy loop, also while draining
        if client is not None:
            client.close()

    def _chat(self) -> None:
        http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=self.call_timeout,
                                                                         read=self.call_timeout))
        url = f"http://127.0.0.1:{self.served.port}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {self.served.keys[1]}", "Content-Type": "application/json"}
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Goal: craft a stick."}]})
        while not self._stop.is_set():
            status = self._timed(self.calls, "calls", lambda: http.request("POST", url, body=body,
                                                                           headers=headers).status)
            if status is not None and status != 200:
                self.failures["calls"] += 1
            self._stop.wait(0.02)

    def stop(self, drain_s: float = 20.0) -> dict[str, Any]:
        """Stop probing; the legitimate client finishes the episodes it started (re-running failed ones)."""
        self._stop.set()
        deadline = time.monotonic() + drain_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._abandon.set()
        return self.figures()

    def figures(self) -> dict[str, Any]:
        ms = lambda values, q: round(percentile(values, q) * 1000, 1)  # noqa: E731
        return {"health_p50_ms": ms(self.health, 0.5), "health_p99_ms": ms(self.health, 0.99),
                "health_max_ms": ms(self.health, 1.0), "health_probes": len(self.health),
                "health_failed": self.failures["health"], "call_p50_ms": ms(self.calls, 0.5),
                "call_p99_ms": ms(self.calls, 0.99), "call_max_ms": ms(self.calls, 1.0), "calls": len(self.calls),
                "calls_failed": self.failures["calls"], **{f"episodes_{k}": v for k, v in self.episodes.items()},
                "episodes_lost": self.episodes["started"] - self.episodes["completed"],
                "rss_start_mb": round(self.rss[0] / 2**20, 1),
                "rss_growth_mb": round((max(self.rss) - self.rss[0]) / 2**20, 1)}


__all__ = ["ClaimedBodies", "HugeHeads", "HugeRequest", "IdleConnections", "Served", "TOKEN", "Watch",
           "percentile", "start_env_server", "start_gateway"]
