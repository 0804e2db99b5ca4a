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

Errors: 400 malformed JSON, request or HTTP framing (``{"error": message}``), 401 no or wrong token
(servers with a token), 404 unknown path, 405 wrong method, 408 a request head or body that did not
arrive in time (``HEAD_TIMEOUT_S``, ``BODY_TIMEOUT_S``; the connection is closed), 411 no
``Content-Length``, 413 body over ``max_body_bytes`` (not read; the connection is closed), 500 an
unexpected server fault (the server keeps running). Nothing received is ever unpickled or evaluated:
bodies go through ``orjson.loads`` and the pool's checks.

Each shard is a uvicorn server (httptools, and uvloop when installed) on a socket bound here, so a
taken port fails at construction, running on a daemon thread while the main thread keeps to
signals, so a hung environment never keeps a process from exiting. The event loop only moves
bytes: requests are parsed, served and answered in JSON on the pool's daemon threads, an instance
at a time under its own lock, so ``/health``, ``/info`` and other instances answer while a call is
slow or hangs (see :mod:`agentrl.envs.server.batches`). Bodies held at once are bounded
(``BODY_BUDGET_BYTES``); a client that disconnects mid-body costs one log line. Keep-alive
connections idle for ``KEEP_ALIVE_S`` are closed (the client notices that before reusing one).

With ``shards > 1`` the instances are split over that many processes: this one serves the first
shard on the given port, the others listen on free ports of the same host, and ``/info`` lists
them all, so a client holding one URL uses every core. A shard process that dies is started again
on its port (fresh instances: reset them), so clients reconnect to it without being told; with
``call_timeout_s`` a hung reset/step is abandoned and its instance rebuilt (see ``EnvPool``).
A server bound beyond the loopback interface requires a token (:mod:`agentrl.envs.server.auth`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
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
from agentrl.envs.server.auth import TOKEN_ENV, TokenCheck, check_token, refuse_open_bind
from agentrl.envs.server.http_protocol import LOG, BodyBudget, JSONErrorProtocol, dumps
from agentrl.envs.server.pool import EnvPool, shard_sizes

DEFAULT_MAX_BODY_BYTES = 16 << 20
POST_ROUTES = {"/reset": "reset", "/step": "step", "/expert": "expert"}
LISTEN_BACKLOG = 256        # many clients connecting at once must not be reset
KEEP_ALIVE_S = 300.0        # idle keep-alive connections are closed after this
BODY_TIMEOUT_S = 30.0       # a request body must be complete this long after its head
BODY_BUDGET_BYTES = 64 << 20  # request bodies held at once (read, parsed, being served); at least one max body
PARSE_ALONE_BYTES = 1 << 20   # larger bodies are parsed one at a time (a parse holds the GIL throughout)
GRACEFUL_SHUTDOWN_S = 2.0   # on close, requests still running after this are abandoned
EVENT_LOOP = "auto"         # uvloop when installed, else asyncio
_JSON_HEADERS = [(b"content-type", b"application/json")]
_UNAUTHORIZED_HEADERS = [(b"www-authenticate", b"Bearer")]


def _reply(status: int, body: dict[str, Any], close: bool = False) -> Response:
    return Response(dumps(body), status, {"Connection": "close"} if close else None, "application/json")


async def _send_json(send: Callable, status: int, data: bytes, close: bool = False,
                     extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = _JSON_HEADERS + [(b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    if extra:
        headers += extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _settle(future: asyncio.Future, reply: tuple[int, bytes]) -> None:
    if not future.done():
        future.set_result(reply)


class _BodyLate(Exception):
    """The request body did not arrive within ``BODY_TIMEOUT_S``."""


class PoolHTTPServer:
    """One shard: ``pool`` served by uvicorn on a listening socket bound at construction.

    The event loop only moves bytes: every reset/step/expert request is parsed, served and its reply
    encoded on a pool thread (:class:`~agentrl.envs.server.batches.DaemonThreads`), so ``/health``,
    ``/info`` and requests for other instances are answered while an environment call is slow or
    hangs. ``token``: every route but ``/health`` requires ``Authorization: Bearer <token>``.
    ``ssl_certfile``/``ssl_keyfile``: serve HTTPS (uvicorn's TLS)."""

    def __init__(self, address: tuple[str, int], pool: EnvPool,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, verbose: bool = False, token: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None):
        self.pool = pool
        self.max_body_bytes = int(max_body_bytes)
        self.verbose = verbose
        self.token_check = TokenCheck(check_token(token, "token=")) if token is not None else None
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.create_server(address, family=family, backlog=LISTEN_BACKLOG)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self.shards: list[dict[str, int]] = [{"port": self.server_address[1], "first_id": pool.first_id,
                                              "size": pool.size}]
        self.openapi = openapi_document()
        self._openapi_json = dumps(self.openapi)
        self.body_budget = BodyBudget(max(BODY_BUDGET_BYTES, self.max_body_bytes))
        self._big_parse = threading.Lock()
        self.starlette = self._build_app()
        if verbose and not logging.getLogger("uvicorn").handlers:
            logging.getLogger("uvicorn").addHandler(logging.StreamHandler())
        self._uvicorn = uvicorn.Server(uvicorn.Config(
            self.app, http=JSONErrorProtocol, loop=EVENT_LOOP, lifespan="off", log_config=None, interface="asgi3",
            proxy_headers=False, ws="none",
            log_level="info" if verbose else "error", access_log=verbose, backlog=LISTEN_BACKLOG,
            timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            server_header=False, date_header=False, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile))
        if ssl_certfile:
            self._uvicorn.config.load()  # a bad certificate or key fails here, not on the serving thread
        self._stopped = threading.Event()
        self._stopped.set()

    # ----- the app ---------------------------------------------------------------------------
    async def app(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        """The ASGI app: the token check, then pool requests straight to :meth:`_pool_request`
        (Starlette's routing and middleware cost a tenth of a small step batch), the rest to Starlette."""
        path = scope["path"]
        if self.token_check is not None and path != "/health":
            problem = self.token_check.problem(scope["headers"])
            if problem is not None:
                await _send_json(send, 401, dumps({"error": problem}), close=scope.get("method") == "POST",
                                 extra=_UNAUTHORIZED_HEADERS)
                return
        op = POST_ROUTES.get(path)
        if op is not None and scope.get("method") == "POST":
            await self._pool_request(op, scope, receive, send)
        else:
            await self.starlette(scope, receive, send)

    def _build_app(self) -> Starlette:
        routes = [Route("/health", self._health, methods=["GET"]),
                  Route("/info", self._info, methods=["GET"]),
                  Route("/openapi.json", self._openapi, methods=["GET"]),
                  Route("/docs", self._docs, methods=["GET"])]
        routes += [Route(path, self._health, methods=["POST"]) for path in POST_ROUTES]  # POSTs go to app()
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

    async def _pool_request(self, op: str, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        length_text = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length_text = value.decode("latin-1")
                break
        if length_text is None:
            await _send_json(send, 411, dumps({"error": "a Content-Length header is required"}), close=True)
            return
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            await _send_json(send, 400, dumps({"error": f"bad Content-Length {length_text!r}"}), close=True)
            return
        if length > self.max_body_bytes:
            await _send_json(send, 413, dumps({"error": f"body of {length} bytes is over the limit of "
                                                        f"{self.max_body_bytes}"}), close=True)
            return
        await self.body_budget.take(length)
        try:
            try:
                body = await self._read_body(receive, length)
            except _BodyLate as late:
                LOG.warning("%s: %s; answered 408 and closed the connection", _who(scope), late)
                await _send_json(send, 408, dumps({"error": str(late)}), close=True)
                return
            if body is None:  # the client went away: one line, no traceback, nothing to answer
                return
            loop = asyncio.get_running_loop()
            future = loop.create_future()

            def reply(status: int, data: bytes) -> None:  # on a pool thread
                try:
                    loop.call_soon_threadsafe(_settle, future, (status, data))
                except RuntimeError:  # the loop is closed: nobody waits for this any more
                    pass

            self.pool.threads.submit(self._serve, op, body, reply)
            try:
                status, data = await future
            except asyncio.CancelledError:  # the server is closing and this call still runs
                task = asyncio.current_task()
                if hasattr(task, "uncancel"):
                    task.uncancel()
                status, data = 503, dumps({"error": f"the server closed while this {op} was still running; "
                                                    "the instances' state is unknown: reset them"})
        finally:
            self.body_budget.give(length)
        await _send_json(send, status, data)

    async def _read_body(self, receive: Callable, length: int) -> bytes | bytearray | None:
        """The whole body (None if the client disconnected first), or :class:`_BodyLate`."""
        task = asyncio.current_task()
        late: list[bool] = []

        def too_late() -> None:
            late.append(True)
            task.cancel()

        timer = asyncio.get_running_loop().call_later(BODY_TIMEOUT_S, too_late)
        got = 0
        try:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body"):
                return message.get("body", b"")
            body = bytearray(length)
            while message["type"] == "http.request":
                chunk = message.get("body", b"")
                body[got:got + len(chunk)] = chunk
                got += len(chunk)
                if not message.get("more_body"):
                    return body
                message = await receive()
            LOG.warning("a client disconnected before its request body was complete (%d of %d bytes)", got, length)
            return None
        except asyncio.CancelledError:
            if not late:
                raise
            if hasattr(task, "uncancel"):  # Python 3.11+: the cancel was ours, handled here
                task.uncancel()
            raise _BodyLate(f"the request body did not arrive within {BODY_TIMEOUT_S:g} s "
                            f"({got} of {length} bytes; BODY_TIMEOUT_S)") from None
        finally:
            timer.cancel()

    def _serve(self, op: str, body: bytes | bytearray, reply: Callable[[int, bytes], None]) -> None:
        """On a pool thread: parse, serve (``reply`` comes from whichever thread finishes the batch)."""
        try:
            if len(body) > PARSE_ALONE_BYTES:  # the GIL is held for the whole parse (200 ms for 14 MiB of
                with self._big_parse:          # numbers): one at a time, so the loop waits for one at most
                    payload = orjson.loads(body)
            else:
                payload = orjson.loads(body)
        except orjson.JSONDecodeError as err:  # also for bytes that are not UTF-8
            reply(400, dumps({"error": f"the body is not valid UTF-8 JSON: {err}"}))
            return
        del body

        def done(result: tuple[int, dict[str, Any]]) -> None:
            try:
                data = dumps(result[1])
            except Exception as err:  # noqa: BLE001 - a server fault must not end the server
                reply(500, dumps({"error": f"server fault: {type(err).__name__}: {err}"}))
                return
            reply(result[0], data)

        try:
            self.pool.start(op, payload, done)
        except Exception as err:  # noqa: BLE001 - a server fault must not end the server
            reply(500, dumps({"error": f"server fault: {type(err).__name__}: {err}"}))

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
        keep their main thread for signals: nothing on the loop can block the exit)."""
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


def _who(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"client {client[0]}:{client[1]}" if client else "a client"


def _shard_main(argv: list[str]) -> int:
    """Entry point of an extra shard process: serve on a free port, print it as one JSON line."""
    spec = json.loads(argv[0])
    try:
        pool = EnvPool(spec["env"], spec["size"], spec["env_kwargs"], spec["first_id"],
                       call_timeout_s=spec.get("call_timeout_s"))
        token = os.environ.get(TOKEN_ENV) if spec.get("token") else None  # never on the command line
        server = PoolHTTPServer((spec["host"], spec.get("port", 0)), pool, spec["max_body_bytes"], token=token,
                                ssl_certfile=spec.get("ssl_certfile"), ssl_keyfile=spec.get("ssl_keyfile"))
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
    """Shard 0 in this process plus ``shards - 1`` child processes, all on ``host``.

    ``token``: required from clients (see :mod:`agentrl.envs.server.auth`); without one, a ``host``
    other machines can reach is refused unless ``allow_no_token``. ``ssl_certfile``/``ssl_keyfile``:
    every shard serves HTTPS."""

    def __init__(self, env_name: str, size: int, env_kwargs: dict | None = None, host: str = "127.0.0.1",
                 port: int = 0, shards: int = 1, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 verbose: bool = False, start_timeout: float = 300.0, call_timeout_s: float | None = None,
                 restart_shards: bool = True, token: str | None = None, allow_no_token: bool = False,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None):
        if token is not None:
            check_token(token, "token=")
        refuse_open_bind(host, token, allow_no_token)
        self.token = token
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
                                   "call_timeout_s": call_timeout_s, "token": token is not None,
                                   "ssl_certfile": ssl_certfile, "ssl_keyfile": ssl_keyfile})
                self.children.append(self._spawn(self.specs[-1]))
            self.server = PoolHTTPServer((host, port), EnvPool(env_name, sizes[0], env_kwargs, 0,
                                                               call_timeout_s=call_timeout_s),
                                         max_body_bytes, verbose, token, ssl_certfile, ssl_keyfile)
            for i, child in enumerate(self.children, start=1):
                self.specs[i - 1]["port"] = self._await_port(child, i)
                self.server.shards.append({"port": self.specs[i - 1]["port"], "first_id": firsts[i],
                                           "size": sizes[i]})
        except BaseException:
            self.close()
            raise

    def _spawn(self, spec: dict[str, Any]) -> subprocess.Popen:
        env = dict(os.environ)
        if self.token is not None:  # through the environment, which other users cannot read (not argv)
            env[TOKEN_ENV] = self.token
        return subprocess.Popen([sys.executable, "-m", "agentrl.envs.server.http_server", json.dumps(spec)],
                                stdout=subprocess.PIPE, text=True, env=env)

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
          verbose: bool = False, call_timeout_s: float | None = None, token: str | None = None,
          allow_no_token: bool = False, ssl_certfile: str | None = None, ssl_keyfile: str | None = None) -> int:
    """Run the server until interrupted (SIGINT or SIGTERM); returns the exit code."""
    sharded = ShardedHTTPServer(env_name, size, env_kwargs, host, port, shards, max_body_bytes, verbose,
                                call_timeout_s=call_timeout_s, token=token, allow_no_token=allow_no_token,
                                ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    shards = ", ".join(f"{s['first_id']}..{s['first_id'] + s['size'] - 1} on port {s['port']}"
                       for s in sharded.server.shards)
    scheme = "https" if ssl_certfile else "http"
    print(f"serving {size} x {env_name} at {scheme}://{host}:{sharded.port} (instances {shards}"
          f"{'; token required' if token else ''})", file=sys.stderr, flush=True)
    try:
        sharded.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sharded.close()
    return 0


if __name__ == "__main__":  # an extra shard process started by ShardedHTTPServer
    sys.exit(_shard_main(sys.argv[1:]))
