"""The connection layer of agentrl's HTTP servers (the env server and the agent gateway): uvicorn's
httptools protocol with the limits a server reachable by strangers needs before it authenticates
anyone (docs/reliability.md, "Limits").

* **Request heads**: at most ``max_head_bytes`` (request line and headers, 64 KiB); the parser never
  sees more, the client gets 431 and the connection is closed (httptools grows a header value piece
  by piece: without a cap a 64 MiB header took seconds of the event loop and 100+ MB). A head must
  be complete ``head_timeout_s`` after the connection was accepted, or after its first byte on a
  kept-alive connection, whose idle time the keep-alive bounds (408; a connection that sends
  nothing is closed without a word).
* **Keep-alive**: a connection that made an authenticated request (the app calls
  ``connection_of(scope).prove()``) is closed after ``keep_alive_s`` idle; any other after
  ``unproven_keep_alive_s``; a 401 closes it at once (the app sends ``Connection: close``).
* **A connection cap** (``max_connections``, below the process's file limit): a connection past it
  takes the place of an unauthenticated one that is idle or still sending its head, taken from the
  client address holding the most such connections (so no client holds the cap), else of the
  authenticated connection idle the longest; when every connection is busy it is answered 503 and
  closed. ``/health`` and authenticated clients are therefore answered while an attacker holds
  thousands of idle or half-sent connections.
* Errors the parser raises are answered in the server's own JSON error shape (400) and closed;
  replies written in one turn of the event loop leave in one ``write`` (:class:`CoalescingTransport`).
  The warnings these limits log are rate-limited (:class:`LogLimiter`): a flood costs a few lines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import time
from typing import Any, Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 << 10       # a request line and its headers, in all
HEAD_TIMEOUT_S = 10.0           # a request head must be complete this long after accept or the last reply
KEEP_ALIVE_S = 15.0             # idle keep-alive of a connection that made an authenticated request
UNPROVEN_KEEP_ALIVE_S = 2.0     # idle keep-alive of any other connection (a /health probe, ...)
MAX_CONNECTIONS = 2048          # open connections at most (lowered to fit the file limit)
FD_RESERVE = 64                 # file descriptors kept for everything but connections (logs, pipes, envs)
LISTEN_BACKLOG = 256            # many clients connecting at once must not be reset; also the accept burst

LOG = logging.getLogger("agentrl.http")


class LogLimiter:
    """At most ``burst`` warnings of one kind per ``window_s``; then one line counting the ones left out."""

    def __init__(self, logger: logging.Logger, burst: int = 10, window_s: float = 10.0):
        self.logger, self.burst, self.window_s = logger, int(burst), float(window_s)
        self._windows: dict[str, list[float]] = {}      # kind -> [window start, lines in it, left out]

    def warning(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        window = self._windows.setdefault(kind, [now, 0, 0])
        if now - window[0] >= self.window_s:
            if window[2]:
                self.logger.warning("%d more warnings like this were left out: " + message, window[2], *args)
            window[:] = [now, 0, 0]
        if window[1] < self.burst:
            window[1] += 1
            self.logger.warning(message, *args)
        else:
            window[2] += 1


def json_error(status: int, message: str) -> bytes:
    """The env server's error body: ``{"error": message}``."""
    return json.dumps({"error": message}, separators=(",", ":")).encode("utf-8")


def connection_cap(max_connections: int = MAX_CONNECTIONS) -> int:
    """``max_connections`` lowered so that open connections, an accept burst (``LISTEN_BACKLOG``) and
    ``FD_RESERVE`` other files fit in this process's file limit (RLIMIT_NOFILE): past the limit
    accepting fails, and the clients that are refused then are anyone's, authenticated or not."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):      # no resource module (Windows)
        return max_connections
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(8, min(max_connections, soft - LISTEN_BACKLOG - FD_RESERVE))


def raise_file_limit(ceiling: int = 65536) -> int:
    """Raise this process's soft file limit to its hard limit (at most ``ceiling``), as servers do at
    start: the connection cap follows it. Returns the soft limit now (0 where there is none)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):      # no resource module (Windows), or not allowed
        return 0


@dataclasses.dataclass
class ConnectionLimits:
    """One server's limits (module docstring); the defaults are the module's constants at creation."""

    max_head_bytes: int = dataclasses.field(default_factory=lambda: MAX_HEAD_BYTES)
    head_timeout_s: float = dataclasses.field(default_factory=lambda: HEAD_TIMEOUT_S)
    keep_alive_s: float = dataclasses.field(default_factory=lambda: KEEP_ALIVE_S)
    unproven_keep_alive_s: float = dataclasses.field(default_factory=lambda: UNPROVEN_KEEP_ALIVE_S)
    max_connections: int = dataclasses.field(default_factory=lambda: connection_cap())


def error_reply(status: int, reason: str, body: bytes, extra: str = "") -> bytes:
    """A whole HTTP/1.1 error reply with a JSON body that closes the connection."""
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra}connection: close\r\n\r\n").encode("ascii") + body


class CoalescingTransport:
    """A transport whose writes made in one turn of the event loop leave as one ``write``: uvicorn
    writes a reply's head and body apart, which cost two system calls (a third of the env server's
    time on a batch of 16 TextCraft steps). Everything else goes to the real transport."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self._flush)
        else:
            self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:       # asked several times per request: not through __getattr__
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class ConnectionGuard:
    """The open connections of one server (event-loop side only) and which one gives way to a newcomer
    past the cap. ``error_body(status, message)``: the server's JSON error shape."""

    def __init__(self, limits: ConnectionLimits | None = None,
                 error_body: Callable[[int, str], bytes] = json_error):
        self.limits = limits or ConnectionLimits()
        self.error_body = error_body
        self.open: set[GuardedProtocol] = set()
        # connections that may give way, oldest first: unauthenticated ones not running a request, per
        # client address; authenticated ones idle between requests
        self._unproven: dict[str, dict[GuardedProtocol, None]] = {}
        self._idle_proven: dict[GuardedProtocol, None] = {}
        self.evicted = 0        # connections closed to make room for a newcomer
        self.refused = 0        # newcomers answered 503
        self.log = LogLimiter(LOG)

    def protocol_class(self) -> type:
        """The uvicorn protocol class (``uvicorn.Config(http=...)``) of connections under this guard."""
        return type("GuardedProtocol", (GuardedProtocol,), {"guard": self})

    def admit(self, connection: GuardedProtocol) -> bool:
        """A new connection: True when it may stay (a waiting connection was closed for it if needed)."""
        if len(self.open) >= self.limits.max_connections:
            victim = self._victim()
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            victim.give_way()
        self.open.add(connection)
        self.waiting(connection)
        return True

    def _victim(self) -> GuardedProtocol | None:
        if self._unproven:
            host = max(self._unproven, key=lambda h: len(self._unproven[h]))
            return next(iter(self._unproven[host]))
        return next(iter(self._idle_proven), None)

    def waiting(self, connection: GuardedProtocol) -> None:
        """``connection`` runs no request now (opened, or its reply was sent): it may give way."""
        self.busy(connection)
        if connection.proven:
            self._idle_proven[connection] = None
        else:
            self._unproven.setdefault(connection.host, {})[connection] = None

    def head_started(self, connection: GuardedProtocol) -> None:
        """A request head began: an authenticated connection is not idle any more."""
        self._idle_proven.pop(connection, None)

    def busy(self, connection: GuardedProtocol) -> None:
        """``connection`` runs a request (or closed): it gives way to nobody."""
        self._idle_proven.pop(connection, None)
        group = self._unproven.get(connection.host)
        if group is not None:
            group.pop(connection, None)
            if not group:
                del self._unproven[connection.host]

    def closed(self, connection: GuardedProtocol) -> None:
        self.busy(connection)
        self.open.discard(connection)

    def stats(self) -> dict[str, int]:
        return {"open": len(self.open), "cap": self.limits.max_connections, "evicted": self.evicted,
                "refused": self.refused}


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under a :class:`ConnectionGuard` (module docstring); made per server
    by :meth:`ConnectionGuard.protocol_class`."""

    guard: ConnectionGuard
    proven = False              # made an authenticated request
    host = ""
    _admitted = False
    _head_open = True           # the next bytes belong to a request head
    _head_bytes = 0             # bytes of it given to the parser so far
    _head_begun = False         # bytes of a request head arrived (its headers are not complete yet)
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def, override]
        # uvloop sets TCP_NODELAY itself, asyncio not on these sockets (proto 0); without it each
        # reply waits for the client's delayed ACK (40 ms)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self.host = self.client[0] if self.client else ""
        self._admitted = self.guard.admit(self)
        if not self._admitted:
            cap = self.guard.limits.max_connections
            self.guard.log.warning("cap", "refused a connection from %s: %d connections open, all busy (the cap)",
                                   self.host, cap)
            self._fail(503, "Service Unavailable", f"this server holds its maximum of {cap} connections and all "
                       "are busy; try again shortly", extra="retry-after: 1\r\n")
            return
        self._head_timer = self.loop.call_later(self.guard.limits.head_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self.guard.closed(self)
        super().connection_lost(exc)

    def prove(self) -> None:
        """The app authenticated a request of this connection: it keeps the longer keep-alive and gives
        way only to newcomers when no unauthenticated connection is left to close."""
        self.proven = True

    def close_after_reply(self) -> None:
        """Close the connection once the reply in progress is sent (what a 401 does)."""
        if self.cycle is not None:
            self.cycle.keep_alive = False

    def give_way(self) -> None:
        """Closed for a newcomer past the cap."""
        self.guard.busy(self)
        self._cancel_head_timer()
        if not self.transport.is_closing():
            self.transport.close()

    # ----- the parser's input ------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        """At most ``max_head_bytes`` of a request head reach the parser; past that, 431 and close."""
        limit = self.guard.limits.max_head_bytes
        while data:
            if not self._head_open:         # a body: the parser takes it as it comes
                super().data_received(data)
                return
            room = limit - self._head_bytes + 1
            piece, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
            self._head_bytes += len(piece)
            super().data_received(piece)
            if self.transport.is_closing():
                return
            if self._head_open and self._head_bytes > limit:
                self.guard.log.warning("head", "closed the connection of %s: its request head is over %d bytes "
                                       "(max_head_bytes)", self._who(), limit)
                self._fail(431, "Request Header Fields Too Large", f"the request head (request line and headers) "
                           f"is over {limit} bytes")
                return

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["agentrl.connection"] = self  # type: ignore[typeddict-unknown-key]
        self._head_begun = True
        self.guard.head_started(self)
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.guard.limits.head_timeout_s, self._head_late)

    def on_headers_complete(self) -> None:
        self._head_open = self._head_begun = False
        self._cancel_head_timer()
        self.guard.busy(self)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_open, self._head_bytes = True, 0

    def on_response_complete(self) -> None:
        limits = self.guard.limits
        self.timeout_keep_alive = limits.keep_alive_s if self.proven else limits.unproven_keep_alive_s
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.guard.waiting(self)

    # ----- deadlines and errors ------------------------------------------------------------------------
    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _who(self) -> str:
        return "%s:%d" % tuple(self.client[:2]) if self.client else "a client"

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        timeout = self.guard.limits.head_timeout_s
        if self._head_begun:
            self.guard.log.warning("late", "closed the connection of %s: its request head was not complete "
                                   "within %g s (head_timeout_s)", self._who(), timeout)
            self._fail(408, "Request Timeout", f"the request head did not arrive within {timeout:g} s")
            return
        LOG.info("closed the connection of %s: no request %g s after it connected (head_timeout_s)",
                 self._who(), timeout)
        self.transport.close()

    def _fail(self, status: int, reason: str, message: str, extra: str = "") -> None:
        self.transport.write(error_reply(status, reason, self.guard.error_body(status, message), extra))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._fail(400, "Bad Request", f"malformed HTTP request (request line, a header or Content-Length): {msg}")


def connection_of(scope: dict[str, Any]) -> GuardedProtocol | None:
    """The connection a request came on (None on a server without the guard, e.g. under a test client)."""
    return scope.get("agentrl.connection")


__all__ = ["ConnectionGuard", "ConnectionLimits", "CoalescingTransport", "GuardedProtocol", "LISTEN_BACKLOG", "LogLimiter",
           "connection_cap", "connection_of", "error_reply", "json_error", "raise_file_limit"]
