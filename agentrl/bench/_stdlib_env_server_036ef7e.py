"""The previous HTTP env server, kept only as the reference for ``agentrl bench env-server``.

The hand-written stdlib server (``http.server.ThreadingHTTPServer``, one thread per connection)
that commit 036ef7e replaced with Starlette on uvicorn, restored from ``036ef7e^`` with only what
it needs to run beside the current code: ``shard_sizes`` comes from the pool module and extra shard
processes start this module. It serves the current :class:`EnvPool`, so a comparison measures the
HTTP layers alone. Not used by anything else; do not extend it.

Its original description follows.

The pool server over HTTP: ``agentrl envs serve NAME --port P`` (stdlib only, JSON only).

Routes (all bodies are JSON objects; see :mod:`agentrl.envs.server.pool` for their fields):

``GET  /health``   ``{"ok": true}``
``GET  /info``     the pool's description, plus ``shards``: ``[{"port", "first_id", "size"}]`` for
                   every process of this server (clients route instance ids with it)
``POST /reset``    ``{"items": [{"instance_id", "task": {"split", "index"}}]}``
``POST /step``     ``{"items": [{"instance_id", "action"}]}``
``POST /expert``   ``{"instance_ids": [...]}``

Errors: 400 malformed JSON or request (``{"error": message}``), 404 unknown path, 405 wrong
method, 411 no ``Content-Length``, 413 body over ``max_body_bytes`` (not read; the connection is
closed), 500 an unexpected server fault (the server keeps running). Nothing received is ever
unpickled or evaluated: bodies go through ``json.loads`` and the pool's checks.

With ``shards > 1`` the instances are split over that many processes: this one serves the first
shard on the given port, the others listen on free ports of the same host, and ``/info`` lists
them all, so a client holding one URL uses every core. A shard process that dies is started again
on its port (fresh instances: reset them), so clients reconnect to it without being told; with
``call_timeout_s`` a hung reset/step is abandoned and its instance rebuilt (see ``EnvPool``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentrl.envs.server.pool import EnvPool, shard_sizes

DEFAULT_MAX_BODY_BYTES = 16 << 20
POST_ROUTES = {"/reset": "reset", "/step": "step", "/expert": "expert"}


class PoolHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # the stdlib's 5 resets connections when many clients connect at once

    def __init__(self, address: tuple[str, int], pool: EnvPool,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, verbose: bool = False):
        super().__init__(address, PoolRequestHandler)
        self.pool = pool
        self.max_body_bytes = int(max_body_bytes)
        self.verbose = verbose
        self.shards: list[dict[str, int]] = [{"port": self.server_address[1], "first_id": pool.first_id,
                                              "size": pool.size}]


class PoolRequestHandler(BaseHTTPRequestHandler):
    server: PoolHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms ACK stalls

    def _reply(self, status: int, body: dict[str, Any], close: bool = False) -> None:
        data = json.dumps(body, separators=(",", ":")).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        try:
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. its timeout)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if self.path == "/health":
            self._reply(200, {"ok": True})
        elif self.path == "/info":
            self._reply(200, {**self.server.pool.describe(), "shards": self.server.shards})
        elif self.path in POST_ROUTES:
            self._reply(405, {"error": f"use POST for {self.path}"})
        else:
            self._reply(404, {"error": f"no route {self.path}; try /info, /reset, /step, /expert"})

    def do_POST(self) -> None:  # noqa: N802
        op = POST_ROUTES.get(self.path)
        if op is None:
            status = 405 if self.path in ("/info", "/health") else 404
            self._reply(status, {"error": f"no POST route {self.path}"}, close=True)
            return
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self._reply(411, {"error": "a Content-Length header is required"}, close=True)
            return
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            self._reply(400, {"error": f"bad Content-Length {length_text!r}"}, close=True)
            return
        if length > self.server.max_body_bytes:
            self._reply(413, {"error": f"body of {length} bytes is over the limit of "
                                       f"{self.server.max_body_bytes}"}, close=True)
            return
        raw = self.rfile.read(length)
        try:
            payload = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            self._reply(400, {"error": f"the body is not valid UTF-8 JSON: {err}"})
            return
        try:
            status, body = self.server.pool.handle(op, payload)
        except Exception as err:  # noqa: BLE001 - a server fault must not end the server
            self._reply(500, {"error": f"server fault: {type(err).__name__}: {err}"})
            return
        self._reply(status, body)

    def _method_not_allowed(self) -> None:
        self._reply(405, {"error": f"method {self.command} is not supported"}, close=True)

    do_PUT = do_DELETE = do_PATCH = _method_not_allowed


def _shard_main(argv: list[str]) -> int:
    """Entry point of an extra shard process: serve on a free port, print it as one JSON line."""
    spec = json.loads(argv[0])
    try:
        pool = EnvPool(spec["env"], spec["size"], spec["env_kwargs"], spec["first_id"],
                       call_timeout_s=spec.get("call_timeout_s"))
        server = PoolHTTPServer((spec["host"], spec.get("port", 0)), pool, spec["max_body_bytes"])
    except Exception as err:  # noqa: BLE001 - reported to the parent, which fails loudly
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}), flush=True)
        return 1
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    server.serve_forever()
    return 0


def _first_line(process: subprocess.Popen, timeout: float) -> str:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


class ShardedHTTPServer:
    """Shard 0 in this process plus ``shards - 1`` child processes, all on ``host``."""

    def __init__(self, env_name: str, size: int, env_kwargs: dict | None = None, host: str = "127.0.0.1",
                 port: int = 0, shards: int = 1, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 verbose: bool = False, start_timeout: float = 300.0, call_timeout_s: float | None = None,
                 restart_shards: bool = True):
        env_kwargs = dict(env_kwargs or {})
        sizes = shard_sizes(size, shards)
        firsts = [sum(sizes[:i]) for i in range(shards)]
        self.children: list[subprocess.Popen] = []
        self.specs: list[dict[str, Any]] = []
        self.restarts = 0   # shard processes started again after they died
        self.start_timeout = start_timeout
        self.restart_shards = restart_shards
        self._started = False
        self._closing = threading.Event()
        try:
            for i in range(1, shards):
                self.specs.append({"env": env_name, "env_kwargs": env_kwargs, "host": host, "size": sizes[i],
                                   "first_id": firsts[i], "max_body_bytes": max_body_bytes,
                                   "call_timeout_s": call_timeout_s})
                self.children.append(self._spawn(self.specs[-1]))
            self.server = PoolHTTPServer((host, port), EnvPool(env_name, sizes[0], env_kwargs, 0,
                                                               call_timeout_s=call_timeout_s),
                                         max_body_bytes, verbose)
            for i, child in enumerate(self.children, start=1):
                self.specs[i - 1]["port"] = self._await_port(child, i)
                self.server.shards.append({"port": self.specs[i - 1]["port"], "first_id": firsts[i],
                                           "size": sizes[i]})
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _spawn(spec: dict[str, Any]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "agentrl.bench._stdlib_env_server_036ef7e",
                                 json.dumps(spec)], stdout=subprocess.PIPE, text=True)

    def _await_port(self, child: subprocess.Popen, shard: int) -> int:
        line = _first_line(child, self.start_timeout)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            reply = {"error": f"no answer (exit code {child.poll()}); see its stderr"}
        if "port" not in reply:
            raise RuntimeError(f"shard {shard} of {self.specs[shard - 1]['env']!r} failed to start: "
                               f"{reply.get('error')}")
        return int(reply["port"])

    def _supervise(self) -> None:
        """Start a dead shard process again on its port (its instances come back fresh)."""
        while not self._closing.wait(0.2):
            for n, child in enumerate(self.children):
                if child.poll() is None or self._closing.is_set():
                    continue
                if child.stdout is not None:
                    child.stdout.close()
                print(f"env shard {n + 1} (port {self.specs[n]['port']}) exited with code {child.returncode}; "
                      "starting it again", file=sys.stderr, flush=True)
                try:
                    self.children[n] = self._spawn(self.specs[n])
                    self.restarts += 1
                    self._await_port(self.children[n], n + 1)
                except (OSError, RuntimeError) as err:  # e.g. the port was taken meanwhile: retried
                    print(f"restarting env shard {n + 1} failed: {err}", file=sys.stderr, flush=True)
                    time.sleep(1.0)

    def _start_supervisor(self) -> None:
        if self.restart_shards and self.children:
            threading.Thread(target=self._supervise, name="env-shard-supervisor", daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def shards(self) -> list[dict[str, int]]:
        return self.server.shards

    def serve_forever(self) -> None:
        self._started = True
        self._start_supervisor()
        self.server.serve_forever()

    def start_background(self) -> threading.Thread:
        """Serve from a daemon thread (tests, benchmarks); :meth:`close` stops it."""
        self._started = True
        self._start_supervisor()
        thread = threading.Thread(target=self.server.serve_forever, name="env-pool-http", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._closing.set()
        server = getattr(self, "server", None)
        if server is not None:
            if self._started:
                server.shutdown()
            server.server_close()
            server.pool.close()
        for child in self.children:
            if child.poll() is None:
                child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


def serve(env_name: str, size: int, env_kwargs: dict | None = None, host: str = "127.0.0.1",
          port: int = 8400, shards: int = 1, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          verbose: bool = False, call_timeout_s: float | None = None) -> int:
    """Run the server until interrupted (SIGINT or SIGTERM); returns the exit code."""
    sharded = ShardedHTTPServer(env_name, size, env_kwargs, host, port, shards, max_body_bytes, verbose,
                                call_timeout_s=call_timeout_s)

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    shards = ", ".join(f"{s['first_id']}..{s['first_id'] + s['size'] - 1} on port {s['port']}"
                       for s in sharded.server.shards)
    print(f"serving {size} x {env_name} at http://{host}:{sharded.port} (instances {shards})",
          file=sys.stderr, flush=True)
    try:
        sharded.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sharded.close()
    return 0


if __name__ == "__main__":  # an extra shard process started by ShardedHTTPServer
    sys.exit(_shard_main(sys.argv[1:]))
