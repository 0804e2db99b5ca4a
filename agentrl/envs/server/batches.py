"""How a pool runs a batch of per-instance calls so that one slow or hung instance delays only itself.

A batch (the instances of one reset/step/expert request) is worked through in order by the thread
that received it: no thread hand-over per instance, so fast environments (TextCraft steps take
~15 us) keep their speed. A :class:`Watchdog` thread looks at the calls in progress every
``WATCH_INTERVAL_S``:

* a call running longer than ``SLOW_CALL_S`` has the rest of its batch continue on another thread
  (each further slow call hands on again), so the other instances of the batch are not held up and
  several hung instances of one batch wait out their timeouts at the same time, not one after
  another;
* with a call timeout, a call running past it is abandoned: Python cannot stop a thread, so the
  thread is left to finish or hang on its own, the instance is rebuilt by the pool and answered as
  failed, and when the hung call returns its thread notices it was abandoned and touches nothing.

Every call registers itself in :attr:`Watchdog.running` under a fresh key and takes itself out when
it returns; whoever removes the entry first (the call returning, or the watchdog abandoning it)
owns the outcome (``dict.pop`` is atomic).

:class:`DaemonThreads` is the elastic set of daemon threads all of this runs on (and the HTTP
server's requests): a thread per job in flight, idle ones kept for the next jobs; daemons, so a
hung environment never keeps a process from exiting.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import weakref
from typing import Any, Callable

SLOW_CALL_S = 0.05          # a call running longer has the rest of its batch continue on another thread
WATCH_INTERVAL_S = 0.01     # how often the watchdog looks at the calls in progress
IDLE_AFTER_S = 0.5          # with no call for this long the watchdog sleeps until the next call
IDLE_THREADS_KEPT = 8       # idle daemon threads kept for the next jobs (more are started on demand)


class Abandoned(BaseException):
    """Raised in a call's thread when its call returns after the watchdog abandoned it (a
    ``BaseException``: the pool's ``except Exception`` around environment calls must not catch it)."""


class DaemonThreads:
    """Run jobs on daemon threads, one thread per job in flight: a job that blocks (a hung
    environment) never delays the next one. Idle threads wait for jobs; past ``IDLE_THREADS_KEPT``
    idle ones, a thread that finishes a job ends."""

    def __init__(self, name: str):
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0          # threads waiting for a job and not yet promised one
        self._started = itertools.count()
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._closed:
                return
            if self._idle:
                self._idle -= 1     # promised to this job
                spawn = False
            else:
                spawn = True
        if spawn:  # the first job in a list the thread empties (a Thread keeps its args while it runs)
            threading.Thread(target=self._run, args=([(fn, args)],), name=f"{self.name}-{next(self._started)}",
                             daemon=True).start()
        else:
            self._jobs.put((fn, args))

    def _run(self, first: list[tuple[Callable[..., Any], tuple]]) -> None:
        fn, args = first.pop()
        while fn is not None:
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a job reports its own failures; the thread goes on
                pass
            fn = args = None        # an idle thread holds nothing of its last job (e.g. a pool)
            with self._lock:
                if self._closed or self._idle >= IDLE_THREADS_KEPT:
                    return
                self._idle += 1
            fn, args = self._jobs.get()

    def close(self) -> None:
        """End the idle threads (threads running a job end when it returns)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._jobs.put((None, ()))


class Batch:
    """The per-instance calls of one request. Threads claim the next index from ``claims``
    (``next`` on an ``itertools.count`` is atomic), so the batch can be shared by the thread that
    received it and the threads the watchdog hands it on to; the thread that makes the last
    completion calls ``on_done(results)``."""

    __slots__ = ("op", "items", "timeout", "on_done", "size", "results", "claimed", "claims", "completions")

    def __init__(self, op: str, items: list[tuple[int, Any]], timeout: float | None,
                 on_done: Callable[[list[dict[str, Any]]], None]):
        self.op, self.items, self.timeout, self.on_done = op, items, timeout, on_done
        self.size = len(items)
        self.results: list[Any] = [None] * self.size
        self.claimed = 0                        # a hint for the watchdog: indices handed out so far
        self.claims = itertools.count()
        self.completions = itertools.count(1)

    def complete(self, index: int, result: dict[str, Any]) -> None:
        self.results[index] = result
        if next(self.completions) == self.size:
            self.on_done(self.results)


class Watchdog:
    """Watches the calls in progress of one pool: hands batches on past ``SLOW_CALL_S`` and calls
    ``abandon(batch, index, slot, seconds)`` (on a daemon thread) for a call past its batch's timeout."""

    def __init__(self, threads: DaemonThreads, drive: Callable[[Batch], None],
                 abandon: Callable[[Batch, int, int, float], None], slow_call_s: float = SLOW_CALL_S):
        self.running: dict[int, tuple] = {}     # call key -> (batch, index, slot, started, abandonable)
        self.keys = itertools.count()
        # weakly: the watchdog's thread must not keep an unclosed pool (and its environments) alive
        self._threads, self._drive, self._abandon = threads, weakref.WeakMethod(drive), weakref.WeakMethod(abandon)
        self.slow_call_s = slow_call_s
        self._handed_on: set[int] = set()       # keys of calls whose batch was handed on already
        self.idle = False                       # the watchdog sleeps until wake() (no call for a while)
        self._wake = threading.Event()
        self._closed = False
        threading.Thread(target=self._watch, name="env-pool-watchdog", daemon=True).start()

    # ----- used by the threads that make calls (EnvPool._drive inlines this on its fast path) ------
    def enter(self, batch: Batch, index: int, slot: int, abandonable: bool) -> int:
        """Register a call (or a wait for a busy instance, ``abandonable`` false); its key. The
        caller removes it with ``running.pop(key, None)`` when the call returns: ``None`` means the
        watchdog abandoned the call meanwhile and owns its outcome."""
        key = next(self.keys)
        self.running[key] = (batch, index, slot, time.monotonic(), abandonable)
        if self.idle:
            self.wake()
        return key

    def wake(self) -> None:
        self._wake.set()

    # ----- the watchdog thread ----------------------------------------------------------------
    def _watch(self) -> None:
        quiet_since = time.monotonic()
        while not self._closed:
            time.sleep(WATCH_INTERVAL_S)
            now = time.monotonic()
            if self.running:
                quiet_since = now
                self._look(now)
            elif now - quiet_since > IDLE_AFTER_S:  # no call for a while: sleep until one enters
                self.idle = True
                if not self.running:     # checked again after the flag: a call entering now wakes us
                    self._wake.wait()
                    self._wake.clear()
                self.idle = False
                self._handed_on.clear()
                quiet_since = time.monotonic()

    def _look(self, now: float) -> None:
        drive, abandon = self._drive(), self._abandon()
        if drive is None or abandon is None:    # the pool is gone
            self._closed = True
            return
        entries = list(self.running.items())    # one C call: atomic under the GIL
        for key, (batch, index, slot, started, abandonable) in entries:
            age = now - started
            slow = age >= min(self.slow_call_s, batch.timeout or self.slow_call_s)
            if slow and key not in self._handed_on:
                self._handed_on.add(key)
                if batch.claimed < batch.size:
                    self._threads.submit(drive, batch)
            if abandonable and age >= batch.timeout and self.running.pop(key, None) is not None:
                self._threads.submit(abandon, batch, index, slot, age)
        live = self.running
        self._handed_on = {key for key in self._handed_on if key in live}

    def close(self) -> None:
        self._closed = True
        self._wake.set()
