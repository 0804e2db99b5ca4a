"""One shard of the HTTP env server: an :class:`~agentrl.envs.server.pool.EnvPool` served by uvicorn
(Starlette for the small routes, JSON only). :mod:`agentrl.envs.server.http_server` runs one or more
of them (``agentrl envs serve``).

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
(servers with a token; the connection is closed), 404 unknown path, 405 wrong method, 408 a request
head or body that did not arrive in time (the connection is closed), 411 no ``Content-Length``, 413
body over ``max_body_bytes`` (not read; the connection is closed), 431 a request head over 64 KiB,
503 past the connection cap with every connection busy, 500 an unexpected server fault (the server
keeps running). Nothing received is ever unpickled or evaluated: bodies go through ``orjson.loads``
and the pool's checks.

The connections are guarded as :mod:`agentrl.runtime.http_connections` describes (head size and
deadline, keep-alive, a connection cap); bodies are read as :mod:`agentrl.envs.server.http_bodies`
describes (a deadline from the end of the head, a budget taken as bytes arrive). The event loop
only moves bytes: requests are parsed, served and answered in JSON on the pool's daemon threads, an
instance at a time under its own lock, so ``/health``, ``/info`` and other instances answer while a
call is slow or hangs (see :mod:`agentrl.envs.server.batches`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from typing import Any, Callable

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from agentrl.envs.server import http_bodies
from agentrl.envs.server.api import docs_page, openapi_document
from agentrl.envs.server.auth import TokenCheck, check_token
from agentrl.envs.server.http_bodies import BodyBudget, BodyLate, Held, read_body
from agentrl.envs.server.pool import EnvPool
from agentrl.runtime.http_connections import (LISTEN_BACKLOG, ConnectionGuard, ConnectionLimits, connection_of,
                                              json_error)

DEFAULT_MAX_BODY_BYTES = 16 << 20
POST_ROUTES = {"/reset": "reset", "/step": "step", "/expert": "expert"}
PARSE_ALONE_BYTES = 1 << 20   # larger bodies are parsed one at a time (a parse holds the GIL throughout)
GRACEFUL_SHUTDOWN_S = 2.0     # on close, requests still running after this are abandoned
EVENT_LOOP = "auto"           # uvloop when installed, else asyncio
_JSON_HEADERS = [(b"content-type", b"application/json")]
_UNAUTHORIZED_HEADERS = [(b"www-authenticate", b"Bearer")]

LOG = logging.getLogger("agentrl.envs.server")


def dumps(body: Any) -> bytes:
    """Compact JSON (orjson: non-finite floats become null; a value it cannot take goes through json)."""
    try:
        return orjson.dumps(body)
    except TypeError:  # e.g. an int over 64 bits
        return json.dumps(body, separators=(",", ":")).encode("utf-8")


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


def _who(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"client {client[0]}:{client[1]}" if client else "a client"


class PoolHTTPServer:
    """One shard: ``pool`` served by uvicorn on a listening socket bound at construction.

    The event loop only moves bytes: every reset/step/expert request is parsed, served and its reply
    encoded on a pool thread (:class:`~agentrl.envs.server.batches.DaemonThreads`), so ``/health``,
    ``/info`` and requests for other instances are answered while an environment call is slow or
    hangs. ``token``: every route but ``/health`` requires ``Authorization: Bearer <token>``.
    ``ssl_certfile``/``ssl_keyfile``: serve HTTPS (uvicorn's TLS). ``limits``: the connection limits
    (default: :class:`~agentrl.runtime.http_connections.ConnectionLimits`, the cap from the file limit)."""

    def __init__(self, address: tuple[str, int], pool: EnvPool,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, verbose: bool = False, token: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 limits: ConnectionLimits | None = None):
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
        self.body_budget = BodyBudget(http_bodies.BODY_BUDGET_BYTES, overdraft=self.max_body_bytes)
        self._big_parse = threading.Lock()
        self.guard = ConnectionGuard(limits, json_error)
        self.starlette = self._build_app()
        if verbose and not logging.getLogger("uvicorn").handlers:
            logging.getLogger("uvicorn").addHandler(logging.StreamHandler())
        self._uvicorn = uvicorn.Server(uvicorn.Config(
            self.app, http=self.guard.protocol_class(), loop=EVENT_LOOP, lifespan="off", log_config=None,
            interface="asgi3", proxy_headers=False, ws="none",
            log_level="info" if verbose else "error", access_log=verbose, backlog=LISTEN_BACKLOG,
            timeout_keep_alive=self.guard.limits.keep_alive_s, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            server_header=False, date_header=False, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile))
        if ssl_certfile:
            self._uvicorn.config.load()  # a bad certificate or key fails here, not on the serving thread
        self._stopped = threading.Event()
        self._stopped.set()

    # ----- the app ---------------------------------------------------------------------------
    async def app(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        """The ASGI app: the token check, then pool requests straight to :meth:`_pool_request`
        (Starlette's routing and middleware cost a tenth of a small step batch), the rest to Starlette.
        A request that passes the token check marks its connection authenticated (a longer keep-alive,
        the last to give way past the connection cap); a 401 closes its connection."""
        path = scope["path"]
        if path != "/health":
            problem = self.token_check.problem(scope["headers"]) if self.token_check is not None else None
            if problem is not None:
                await _send_json(send, 401, dumps({"error": problem}), close=True, extra=_UNAUTHORIZED_HEADERS)
                return
            connection = connection_of(scope)
            if connection is not None:
                connection.prove()
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

    def _content_length(self, scope: dict[str, Any]) -> tuple[int | None, tuple[int, str] | None]:
        """The announced body length, or the error to answer (411, 400, 413)."""
        text = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"content-length"), None)
        if text is None:
            return None, (411, "a Content-Length header is required")
        try:
            length = int(text)
            if length < 0:
                raise ValueError
        except ValueError:
            return None, (400, f"bad Content-Length {text!r}")
        if length > self.max_body_bytes:
            return None, (413, f"body of {length} bytes is over the limit of {self.max_body_bytes}")
        return length, None

    async def _pool_request(self, op: str, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        length, refused = self._content_length(scope)
        if refused is not None:
            await _send_json(send, refused[0], dumps({"error": refused[1]}), close=True)
            return
        held = Held()
        try:
            try:
                body = await read_body(receive, length, self.body_budget, held)
            except BodyLate as late:
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
            del body
            try:
                status, data = await future
            except asyncio.CancelledError:  # the server is closing and this call still runs
                task = asyncio.current_task()
                if hasattr(task, "uncancel"):
                    task.uncancel()
                status, data = 503, dumps({"error": f"the server closed while this {op} was still running; "
                                                    "the instances' state is unknown: reset them"})
        finally:
            self.body_budget.give(held.bytes, held)
        await _send_json(send, status, data)

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


__all__ = ["DEFAULT_MAX_BODY_BYTES", "PoolHTTPServer", "dumps"]
