"""Request bodies of the HTTP env server: read as they arrive, within a deadline, against a budget of
bytes held at once.

* **The deadline** (``BODY_TIMEOUT_S``) runs from the end of the request head: a body not complete
  by then is answered 408 and its connection closed.
* **The budget** (:class:`BodyBudget`) bounds the bytes of request bodies held at once (received,
  parsed, being served). A body takes bytes from it as they arrive, never what its head claims: a
  client that sends ``Content-Length: 16777216`` and nothing more holds nothing, so it cannot keep
  real requests waiting (before, five such heads delayed a valid step by 29.5 s). A body whose next
  bytes do not fit waits, in arrival order, before its connection is read further (TCP then holds
  the sender back). One waiting body at a time may go past the budget (the overdraft), so bodies
  that each hold part of the budget never wait for each other for ever. A body that arrived whole
  in one read never waits: it is in memory already.

Held at most: the budget, plus one body over it (``max_body_bytes``), plus per connection what one
read brings before the server stops reading (uvicorn's 64 KiB high-water mark and one read of up to
256 KiB). docs/reliability.md, "Limits", has the figures.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Callable

from agentrl.runtime.http_connections import LogLimiter

BODY_TIMEOUT_S = 30.0           # a request body must be complete this long after its head
BODY_BUDGET_BYTES = 64 << 20    # request bodies held at once (read, parsed, being served)

LOG = logging.getLogger("agentrl.envs.server")
_WARNINGS = LogLimiter(LOG)


class Held:
    """What one request's body holds of the budget (given back once the request is served)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class BodyLate(Exception):
    """The request body did not arrive within ``BODY_TIMEOUT_S`` of its head."""


class BodyBudget:
    """Bytes of request bodies held at once (event-loop side only; module docstring). ``overdraft``:
    how far the one body allowed past the budget may go (the largest body accepted)."""

    def __init__(self, limit: int, overdraft: int = 0):
        self.limit, self.overdraft = int(limit), int(overdraft)
        self.used = 0
        self.peak = 0
        self._over: object | None = None            # the body allowed past the budget now
        self._waiting: collections.deque[tuple[int, object, asyncio.Future]] = collections.deque()

    def _grant(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)

    def _fits(self, size: int, holder: object) -> bool:
        if self.used + size <= self.limit or self._over is holder:
            return True
        if self._over is None and self.used + size <= self.limit + self.overdraft:
            self._over = holder
            return True
        return False

    def add(self, size: int) -> None:
        """Count bytes that are in memory already (a body's last read): never waits."""
        self._grant(size)

    async def take(self, size: int, holder: object) -> None:
        """``size`` more bytes for ``holder``'s body: waits (in arrival order) until they fit."""
        if self._over is holder or (not self._waiting and self._fits(size, holder)):
            self._grant(size)
            return
        future = asyncio.get_running_loop().create_future()
        entry = (size, holder, future)
        self._waiting.append(entry)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.give(size, holder)     # granted just as we were cancelled
            else:
                try:
                    self._waiting.remove(entry)
                except ValueError:          # give() already dropped it as cancelled
                    pass
            raise

    def give(self, size: int, holder: object | None = None) -> None:
        """``holder``'s body is done with ``size`` bytes (all it held, once served)."""
        self.used -= size
        if holder is not None and self._over is holder:
            self._over = None
        while self._waiting:
            size, holder, future = self._waiting[0]
            if future.done():
                self._waiting.popleft()
                continue
            if not self._fits(size, holder):
                break
            self._waiting.popleft()
            self._grant(size)
            future.set_result(None)


async def read_body(receive: Callable, length: int, budget: BodyBudget, held: Held) -> bytes | bytearray | None:
    """The request body (``length`` bytes announced), taking its bytes from ``budget`` as they arrive
    (``held``: what it holds, to give back once served); None when the client went away first;
    :class:`BodyLate` past ``BODY_TIMEOUT_S`` (counted from this call: the end of the head)."""
    task = asyncio.current_task()
    late: list[bool] = []

    def too_late() -> None:
        late.append(True)
        task.cancel()

    timer = asyncio.get_running_loop().call_later(BODY_TIMEOUT_S, too_late)
    body: bytearray | None = None
    got = 0
    try:
        message = await receive()
        while message["type"] == "http.request":
            chunk = message.get("body", b"")
            got += len(chunk)
            if not message.get("more_body"):
                budget.add(len(chunk))
                held.bytes += len(chunk)
                if body is None:
                    return chunk
                body += chunk
                return body
            await budget.take(len(chunk), held)      # before the connection is read further
            held.bytes += len(chunk)
            if body is None:
                body = bytearray(chunk)
            else:
                body += chunk
            message = await receive()
        _WARNINGS.warning("disconnect", "a client disconnected before its request body was complete (%d of %d "
                          "bytes)", got, length)
        return None
    except asyncio.CancelledError:
        if not late:
            raise
        if hasattr(task, "uncancel"):  # Python 3.11+: the cancel was ours, handled here
            task.uncancel()
        raise BodyLate(f"the request body did not arrive within {BODY_TIMEOUT_S:g} s of its head "
                       f"({got} of {length} bytes; BODY_TIMEOUT_S)") from None
    finally:
        timer.cancel()


__all__ = ["BODY_BUDGET_BYTES", "BODY_TIMEOUT_S", "BodyBudget", "BodyLate", "Held", "read_body"]
