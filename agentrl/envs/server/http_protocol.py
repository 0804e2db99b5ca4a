"""The connection-level pieces of the HTTP env server: uvicorn's httptools protocol with JSON errors,
a deadline for each request head, replies written in one piece, and a budget for request bodies.

* A request head (request line and headers) must arrive within ``HEAD_TIMEOUT_S`` of its first byte,
  or of the connection being opened: a client that opens connections and sends nothing, or sends
  its headers a byte at a time, has them closed (uvicorn itself only times out idle keep-alive
  connections). The body has its own deadline (``http_server.BODY_TIMEOUT_S``).
* A reply's head and body are written by two ``send`` calls; :class:`CoalescingTransport` sends
  what was written in one turn of the event loop as one piece (one system call, one TCP segment).
* :class:`BodyBudget`: bodies read and being served at once may hold at most so many bytes; a
  request past it waits (its socket is not read meanwhile, so the sender is held back by TCP).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import socket
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEAD_TIMEOUT_S = 10.0       # a request head must be complete this long after its first byte

LOG = logging.getLogger("agentrl.envs.server")


def dumps(body: Any) -> bytes:
    """Compact JSON (orjson: non-finite floats become null; a value it cannot take goes through json)."""
    try:
        return orjson.dumps(body)
    except TypeError:  # e.g. an int over 64 bits
        return json.dumps(body, separators=(",", ":")).encode("utf-8")


def error_bytes(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 error reply with a JSON body that closes the connection."""
    data = dumps({"error": message})
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
            f"connection: close\r\n\r\n").encode("ascii") + data


class CoalescingTransport:
    """A transport whose writes made in one turn of the event loop leave as one ``write``: uvicorn
    writes a reply's head and body apart, which cost two system calls (a third of the server's time
    on a batch of 16 TextCraft steps). Everything else goes to the real transport."""

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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class JSONErrorProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose answer to a request the parser rejects (bad request line,
    header or ``Content-Length``) is JSON like every other error, with a deadline on request heads."""

    _head_timer: asyncio.TimerHandle | None = None
    _head_begun = False         # bytes of a request head arrived (its headers are not complete yet)

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
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_late)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun = True
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_late)

    def on_headers_complete(self) -> None:
        self._head_begun = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        who = "%s:%d" % tuple(self.client[:2]) if self.client else "a client"
        if self._head_begun:
            LOG.warning("closed the connection of %s: its request head was not complete within %g s "
                        "(HEAD_TIMEOUT_S)", who, HEAD_TIMEOUT_S)
            self.transport.write(error_bytes(408, "Request Timeout", f"the request head did not arrive within "
                                                                      f"{HEAD_TIMEOUT_S:g} s"))
        else:
            LOG.warning("closed the connection of %s: no request %g s after it connected (HEAD_TIMEOUT_S)",
                        who, HEAD_TIMEOUT_S)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self.transport.write(error_bytes(400, "Bad Request", "malformed HTTP request (request line, a header "
                                                             f"or Content-Length): {msg}"))
        self.transport.close()


class BodyBudget:
    """At most ``limit`` bytes of request bodies held at once (event-loop side only). Takers wait in
    arrival order; one body may be as large as the whole budget."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.used = 0
        self.peak = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    async def take(self, size: int) -> None:
        if not self._waiting and self.used + size <= self.limit:
            self._grant(size)
            return
        future = asyncio.get_running_loop().create_future()
        entry = (size, future)
        self._waiting.append(entry)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.give(size)             # granted just as we were cancelled
            else:
                try:
                    self._waiting.remove(entry)
                except ValueError:          # give() already dropped it as cancelled
                    pass
            raise

    def _grant(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)

    def give(self, size: int) -> None:
        self.used -= size
        while self._waiting and self.used + self._waiting[0][0] <= self.limit:
            size, future = self._waiting.popleft()
            if not future.done():
                self._grant(size)
                future.set_result(None)
