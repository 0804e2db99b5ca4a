"""The pool server over HTTP: ``agentrl envs serve NAME --port P`` (Starlette on uvicorn, JSON only).

Routes (all bodies are JSON objects; see :mod:`agentrl.envs.server.pool` for their fields and
:mod:`agentrl.envs.server.api` for the schemas):

``GET  /health``        ``{"ok": true}``
``GET  /info``          the pool's description, plus ``shards``: ``[{"port", "first_id", "size"}]`` for
                        every process of this server (clients route instance ids with it)
``POST /reset``         ``{"items": [{"instance_id", "task": {"split", "index"}}]}``
``POST /step``          ``{"items": [{"instance_id", "action"}]}``
``POST /expert``        ``{"instance_ids": [...]}``
``GET  /openapi.json``  the OpenAPI 3.1 description of all of the above; ``GET /docs`` as a page

Errors: 400 malformed JSON, request or HTTP framing (``{"error": message}``), 404 unknown path,
405 wrong method, 411 no ``Content-Length``, 413 body over ``max_body_bytes`` (not read; the
connection is closed), 500 an unexpected server fault (the server keeps running). Nothing received
is ever unpickled or evaluated: bodies go through ``json.loads`` and the pool's checks.

Each shard is a uvicorn server (httptools and uvloop when installed) on a socket bound here, so a
taken port fails at construction, running on a daemon thread while the main thread keeps to
signals, so a hung environment never keeps a process from exiting. Step batches run on the event
loop (short; handing them to a thread cost 8% of batched steps/s); resets and expert plans, which
can take seconds (games loaded, plans searched), on daemon worker threads, so ``/health`` and
``/info`` answer meanwhile. Keep-alive connections idle for ``KEEP_ALIVE_S`` are closed (the
client notices that before reusing one).

With ``shards > 1`` the instances are split over that many processes: this one serves the first
shard on the given port, the others listen on free ports of the same host, and ``/info`` lists
them all, so a client holding one URL uses every core. A shard process that dies is started again
on its port (fresh instances: reset them), so clients reconnect to it without being told; with
``call_timeout_s`` a hung reset/step is abandoned and its instance rebuilt (see ``EnvPool``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from agentrl.envs.server.api import docs_page, openapi_document
from agentrl.envs.server.pool import EnvPool, shard_sizes

DEFAULT_MAX_BODY_BYTES = 16 << 20
POST_ROUTES = {"/reset": "reset", "/step": "step", "/expert": "expert"}
LISTEN_BACKLOG = 256        # many clients connecting at once must not be reset
KEEP_ALIVE_S = 300.0        # idle keep-alive connections are closed after this
GRACEFUL_SHUTDOWN_S = 2.0   # on close, requests still running after this are abandoned
EVENT_LOOP = "auto"         # uvloop when installed, else asyncio
POOL_WORKERS = 4            # threads that run environment calls (the pool serialises them anyway)


def _dumps(body: Any) -> bytes:
    """Compact JSON (orjson: non-finite floats become null; a value it cannot take goes through json)."""
    try:
        return orjson.dumps(body)
    except TypeError:  # e.g. an int over 64 bits
        return json.dumps(body, separators=(",", ":")).encode("utf-8")


def _reply(status: int, body: dict[str, Any], close: bool = False) -> Response:
    return Response(_dumps(body), status, {"Connection": "close"} if close else None, "application/json")


def _protocol_class() -> type:
    """uvicorn's HTTP protocol (httptools if installed, else h11), whose answer to a request the
    parser rejects (bad request line, header or ``Content-Length``) is JSON like every other error."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class JSONErrorProtocol(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
            # uvloop sets TCP_NODELAY itself, asyncio not on these sockets (proto 0); without it each
            # reply (head and body written apart) stalls 40 ms on the client's delayed ACK
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            super().connection_made(transport)

        def send_400_response(self, msg: str) -> None:
            data = _dumps({"error": f"malformed HTTP request (request line, a header or Content-Length): {msg}"})
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                                 b"content-length: " + str(len(data)).encode() + b"\r\nconnection: close\r\n\r\n"
                                 + data)
            self.transport.close()

    return JSONErrorProtocol


class _DaemonWorkers:
    """Run blocking calls on daemon threads and await them from the event loop (anyio's and
    concurrent.futures' threads are not daemons: a hung environment would block the exit)."""

    def __init__(self, count: int):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        for n in range(count):
            threading.Thread(target=self._loop, name=f"env-pool-worker-{n}", daemon=True).start()
        self._count = count

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            loop, future, fn, args = job
            try:
                outcome = (True, fn(*args))
            except BaseException as err:  # noqa: BLE001 - handed to the awaiting request
                outcome = (False, err)
            try:
                loop.call_soon_threadsafe(self._settle, future, outcome)
            except RuntimeError:  # the loop is closed: nobody waits for this any more
                pass

    @staticmethod
    def _settle(future: asyncio.Future, outcome: tuple[bool, Any]) -> None:
        if future.done():
            return
        ok, value = outcome
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return await future

    def close(self) -> None:
        for _ in range(self._count):
            self._jobs.put(None)


class PoolHTTPServer:
    """One shard: ``pool`` served by uvicorn on a listening socket bound at construction."""

    def __init__(self, address: tuple[str, int], pool: EnvPool,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, verbose: bool = False):
        self.pool = pool
        self.max_body_bytes = int(max_body_bytes)
        self.verbose = verbose
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.create_server(address, family=family, backlog=LISTEN_BACKLOG)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self.shards: list[dict[str, int]] = [{"port": self.server_address[1], "first_id": pool.first_id,
                                              "size": pool.size}]
        self.openapi = openapi_document()
        self._openapi_json = _dumps(self.openapi)
        self._workers = _DaemonWorkers(POOL_WORKERS)
        self.app = self._build_app()
        if verbose and not logging.getLogger("uvicorn").handlers:
            logging.getLogger("uvicorn").addHandler(logging.StreamHandler())
        self._uvicorn = uvicorn.Server(uvicorn.Config(
            self.app, http=_protocol_class(), loop=EVENT_LOOP, lifespan="off", log_config=None,
            log_level="info" if verbose else "error", access_log=verbose, backlog=LISTEN_BACKLOG,
            timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            server_header=False, date_header=False))
        self._stopped = threading.Event()
        self._stopped.set()

    # ----- the app ---------------------------------------------------------------------------
    def _build_app(self) -> Starlette:
        routes = [Route("/health", self._health, methods=["GET"]),
                  Route("/info", self._info, methods=["GET"]),
                  Route("/openapi.json", self._openapi, methods=["GET"]),
                  Route("/docs", self._docs, methods=["GET"])]
        routes += [Route(path, self._post, methods=["POST"]) for path in POST_ROUTES]
        return Starlette(routes=routes, exception_handlers={HTTPException: self._http_error,
                                                            Exception: self._fault})

    async def _health(self, request: Request) -> Response:
        return _reply(200, {"ok": True})

    async def _info(self, request: Request) -> Response:
        return _reply(200, {**self.pool.describe(), "shards": self.shards})

    async def _openapi(self, request: Request) -> Response:
        return Response(self._openapi_json, 200, media_type="application/json")

    async def _docs(self, request: Request) -> Response:
        return HTMLResponse(docs_page(self.openapi))

    async def _post(self, request: Request) -> Response:
        op = POST_ROUTES[request.scope["path"]]
        length_text = request.headers.get("content-length")
        if length_text is None:
            return _reply(411, {"error": "a Content-Length header is required"}, close=True)
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            return _reply(400, {"error": f"bad Content-Length {length_text!r}"}, close=True)
        if length > self.max_body_bytes:
            return _reply(413, {"error": f"body of {length} bytes is over the limit of {self.max_body_bytes}"},
                          close=True)
        raw = await request.body()
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as err:  # also for bytes that are not UTF-8
            return _reply(400, {"error": f"the body is not valid UTF-8 JSON: {err}"})
        try:
            if op == "step":  # short: on the loop (a thread hand-over cost 8% of batched steps/s)
                status, body = self.pool.handle(op, payload)
            else:             # resets load games, plans are searched: seconds, off the loop
                status, body = await self._workers.run(self.pool.handle, op, payload)
        except Exception as err:  # noqa: BLE001 - a server fault must not end the server
            return _reply(500, {"error": f"server fault: {type(err).__name__}: {err}"})
        return _reply(status, body)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path = request.url.path
        if exc.status_code == 404:
            message = f"no route {path}; try /info, /reset, /step, /expert, /openapi.json"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"method {request.method} is not supported on {path}; use {allowed}"
        else:
            message = str(exc.detail)
        return _reply(exc.status_code, {"error": message}, close=request.method == "POST")

    async def _fault(self, request: Request, exc: Exception) -> Response:
        return _reply(500, {"error": f"server fault: {type(exc).__name__}: {exc}"})

    # ----- running -----------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve on this thread until :meth:`shutdown` (the processes run it on a daemon thread and
        keep their main thread for signals: a step that hangs on the loop cannot block the exit)."""
        self._stopped.clear()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def start_background(self) -> threading.Thread:
        """:meth:`serve_forever` on a daemon thread (tests, benchmarks); :meth:`shutdown` stops it."""
        self._stopped.clear()  # now: a shutdown right after this waits for the thread to stop
        thread = threading.Thread(target=self.serve_forever, name="env-pool-http", daemon=True)
        thread.start()
        return thread

    def shutdown(self, timeout: float = GRACEFUL_SHUTDOWN_S + 10.0) -> None:
        """Stop :meth:`serve_forever` (running on another thread) and wait for it to return."""
        self._uvicorn.should_exit = True
        self._stopped.wait(timeout)

    def server_close(self) -> None:
        self.socket.close()
        self._workers.close()


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
    thread = server.start_background()  # this thread keeps to signals (see PoolHTTPServer.serve_forever)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group
        pass
    finally:
        server.shutdown(timeout=GRACEFUL_SHUTDOWN_S + 1.0)
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
        return subprocess.Popen([sys.executable, "-m", "agentrl.envs.server.http_server", json.dumps(spec)],
                                stdout=subprocess.PIPE, text=True)

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
        """Serve until interrupted: the loop runs on a daemon thread, this thread waits for signals."""
        thread = self.start_background()
        while thread.is_alive():
            thread.join(0.5)

    def start_background(self) -> threading.Thread:
        """Serve from a daemon thread (tests, benchmarks); :meth:`close` stops it."""
        self._started = True
        self._start_supervisor()
        return self.server.start_background()

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
