"""A pool of environment instances behind one JSON request API (shared by the Ray and HTTP servers).

One :class:`EnvPool` hosts ``size`` instances of one registered environment, with global instance
ids ``first_id .. first_id + size - 1`` (so several pools, in several processes, can serve one id
space: the shards of a pool). Requests and replies are plain JSON values:

``reset``   ``{"items": [{"instance_id": 0, "task": {"split": "train", "index": 3}}, ...]}``
            -> ``{"results": [{"instance_id", "ok", "error", "obs", "info"}, ...]}``
``step``    ``{"items": [{"instance_id": 0, "action": "get 1 oak logs"}, ...]}``
            -> ``{"results": [{"instance_id", "ok", "error", "obs", "reward", "terminated",
            "truncated", "info"}, ...]}``
``expert``  ``{"instance_ids": [0, 1]}`` -> ``{"results": [{"instance_id", "ok", "error",
            "actions"}, ...]}`` (the expert's plan from the state right after the last reset)
``info``    ``{}`` -> ``{"env", "env_kwargs", "first_id", "size", "split_sizes"}``

:meth:`EnvPool.handle` returns ``(status, body)``: 200 with the results in request order, or 400
with ``{"error": message}`` for a malformed request (unknown or repeated instance id, bad task
address, non-string action, ...), in which case no instance is touched.

Failures inside an environment never escape: the instance is rebuilt from its factory, its result
has ``ok: false``, ``error`` and ``info["env_error"]`` set, and a ``step`` result is ``truncated``
(the episode is over; reset the instance to go on). With ``call_timeout_s`` a reset or step that
does not return in time is a failure of the same kind (:class:`InstanceTimeout`): the hung call is
abandoned on its thread and the instance replaced. Stepping an instance with no running episode
(never reset, or rebuilt after a failure) gives the same kind of per-instance error.

Each instance has its own lock, so requests on different instances run at the same time (on
different threads) and a slow or hung call holds up only its own instance: the rest of its batch
goes on on another thread (:mod:`agentrl.envs.server.batches`). A request for an instance that an
earlier call still runs on waits for it, at most ``INSTANCE_BUSY_WAIT_S`` (then that instance's
result is a "busy" failure).
"""

from __future__ import annotations

import threading
import time
import traceback
import weakref
from typing import Any, Callable

from agentrl.envs import make_env
from agentrl.envs.base import MAX_TEXT_LENGTH, TaskRef, TextEnv
from agentrl.envs.server.batches import Abandoned, Batch, DaemonThreads, Watchdog

OPS = ("reset", "step", "expert", "info")
INSTANCE_BUSY_WAIT_S = 30.0     # a call waits this long for an instance an earlier call still runs on


class BadRequest(ValueError):
    """A request that cannot be served as sent (answered with status 400)."""


class InstanceTimeout(RuntimeError):
    """An environment call ran longer than the pool's ``call_timeout_s``."""


_PLAIN = frozenset((str, int, float, bool, type(None)))


def jsonable(value: Any) -> Any:
    """``value`` with tuples as lists, numpy scalars as numbers and anything unknown as a string."""
    kind = type(value)  # fast path for the plain types every reply is made of (4x on an env's info)
    if kind in _PLAIN:
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): v if type(v) in _PLAIN else jsonable(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [v if type(v) in _PLAIN else jsonable(v) for v in value]
    return _jsonable_any(value)


def _jsonable_any(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        try:
            return jsonable(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class EnvPool:
    """``size`` instances of environment ``env_name``, stepped in batches (see :mod:`.batches` for how
    a batch runs: in order on the calling thread, handed on to other threads past a slow call)."""

    def __init__(self, env_name: str, size: int, env_kwargs: dict[str, Any] | None = None,
                 first_id: int = 0, factory: Callable[..., TextEnv] | None = None,
                 call_timeout_s: float | None = None):
        if size <= 0:
            raise ValueError(f"pool size must be positive, got {size}")
        if call_timeout_s is not None and call_timeout_s <= 0:
            raise ValueError(f"call_timeout_s must be positive (or None for no limit), got {call_timeout_s}")
        self.env_name = env_name
        self.env_kwargs = dict(env_kwargs or {})
        self.first_id = int(first_id)
        self.size = int(size)
        self._factory = factory or (lambda: make_env(env_name, **self.env_kwargs))
        self._envs: list[TextEnv | None] = [self._factory() for _ in range(size)]
        self._active = [False] * size  # an episode is running (reset succeeded, no failure since)
        self._tasks: list[TaskRef | None] = [None] * size
        self._locks = [threading.Lock() for _ in range(size)]  # held while a call runs on the instance
        self.split_sizes = dict(self._envs[0].split_sizes())
        self._count_lock = threading.Lock()
        self.failures = 0
        self.call_timeout_s = call_timeout_s
        self.threads = DaemonThreads("env-pool")
        self.watchdog = Watchdog(self.threads, self._drive, self._abandon)
        weakref.finalize(self, self.watchdog.close)   # an unclosed pool's watchdog ends with it
        weakref.finalize(self, self.threads.close)
        self._calls = {"reset": self._reset, "step": self._step, "expert": self._expert}

    # ----- the JSON API ------------------------------------------------------------------------
    def handle(self, op: str, payload: Any) -> tuple[int, dict[str, Any]]:
        """Serve one request: ``(200, {"results": [...]})`` or ``(400, {"error": message})``.

        Without ``call_timeout_s`` the batch runs on this thread (handed on to others only past a
        slow call); with it, on a pool thread while this one waits, so a hung call never holds
        this thread past the timeout."""
        replies: list[tuple[int, dict[str, Any]]] = []
        finished = threading.Lock()  # released when the reply is in (cheaper than an Event: fewer objects)
        finished.acquire()

        def done(reply: tuple[int, dict[str, Any]]) -> None:
            replies.append(reply)
            finished.release()

        if self.call_timeout_s is None:
            self.start(op, payload, done)
        else:
            self.threads.submit(self.start, op, payload, done)
        if not replies:
            finished.acquire()
        return replies[0]

    def start(self, op: str, payload: Any, done: Callable[[tuple[int, dict[str, Any]]], None]) -> None:
        """Serve one request, calling ``done((status, body))`` once (as :meth:`handle` returns them)
        from the thread that finishes it: this one, or, past a slow or hung call, another."""
        try:
            batch = self._batch(op, payload, lambda results: done((200, {"results": results})))
        except BadRequest as err:
            done((400, {"error": str(err)}))
            return
        if isinstance(batch, dict):
            done((200, batch))
            return
        if batch.size == 0:
            done((200, {"results": []}))
            return
        self._drive(batch)

    def _batch(self, op: str, payload: Any, on_done: Callable[[list], None]) -> Batch | dict[str, Any]:
        """The request checked and turned into a batch of per-instance calls (``info``: the reply)."""
        if op not in OPS:
            raise BadRequest(f"unknown operation {op!r}; expected one of {', '.join(OPS)}")
        if not isinstance(payload, dict):
            raise BadRequest("the request body must be a JSON object")
        if op == "info":
            return self.describe()
        if op == "expert":
            ids = payload.get("instance_ids")
            if not isinstance(ids, list):
                raise BadRequest("'instance_ids' must be a list of instance ids")
            return Batch(op, [(slot, None) for slot in self._slots(ids)], None, on_done)
        items = payload.get("items")
        if not isinstance(items, list):
            raise BadRequest(f"'items' must be a list of {{'instance_id', "
                             f"{'task' if op == 'reset' else 'action'}}} objects")
        check = self._task if op == "reset" else self._action
        work = [(slot, check(item)) for slot, item in zip(self._item_slots(items), items)]
        return Batch(op, work, self.call_timeout_s, on_done)

    def describe(self) -> dict[str, Any]:
        return {"env": self.env_name, "env_kwargs": jsonable(self.env_kwargs),
                "first_id": self.first_id, "size": self.size, "split_sizes": self.split_sizes,
                "failures": self.failures}

    # ----- request checks ----------------------------------------------------------------------
    def _item_slots(self, items: list[Any]) -> list[int]:
        for n, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadRequest(f"items[{n}] must be an object, got {type(item).__name__}")
            if "instance_id" not in item:
                raise BadRequest(f"items[{n}] has no 'instance_id'")
        return self._slots([item["instance_id"] for item in items])

    def _slots(self, ids: list[Any]) -> list[int]:
        seen: set[int] = set()
        slots = []
        for n, instance_id in enumerate(ids):
            if not _is_int(instance_id):
                raise BadRequest(f"instance id #{n} must be an integer, got {instance_id!r}")
            slot = instance_id - self.first_id
            if not 0 <= slot < self.size:
                raise BadRequest(f"unknown instance id {instance_id}: this server holds "
                                 f"{self.first_id}..{self.first_id + self.size - 1}")
            if instance_id in seen:
                raise BadRequest(f"instance id {instance_id} appears twice in one request")
            seen.add(instance_id)
            slots.append(slot)
        return slots

    def _task(self, item: dict[str, Any]) -> TaskRef:
        task = item.get("task")
        if not (isinstance(task, dict) and isinstance(task.get("split"), str) and _is_int(task.get("index"))):
            raise BadRequest(f"instance {item['instance_id']}: 'task' must be "
                             f"{{'split': str, 'index': int}}, got {task!r}")
        size = self.split_sizes.get(task["split"])
        if size is None:
            raise BadRequest(f"unknown split {task['split']!r} for env {self.env_name!r}; "
                             f"available: {sorted(self.split_sizes)}")
        if not 0 <= task["index"] < size:
            raise BadRequest(f"task index {task['index']} out of range for split {task['split']!r} "
                             f"(0..{size - 1})")
        return TaskRef(task["split"], task["index"])

    def _action(self, item: dict[str, Any]) -> str:
        action = item.get("action")
        if not isinstance(action, str):
            raise BadRequest(f"instance {item['instance_id']}: 'action' must be a string, got "
                             f"{type(action).__name__}")
        if len(action) > MAX_TEXT_LENGTH:
            raise BadRequest(f"instance {item['instance_id']}: action longer than {MAX_TEXT_LENGTH} characters")
        return action

    # ----- running a batch ----------------------------------------------------------------------
    def _drive(self, batch: Batch) -> None:
        """Work through ``batch`` on this thread until no index is left to claim (other threads may
        claim indices too, once the watchdog hands the batch on). The fast path is inlined: a
        TextCraft step takes ~15 us, so every call made per instance shows in steps/s."""
        call = self._calls[batch.op]
        watchdog = self.watchdog
        running, keys, monotonic = watchdog.running, watchdog.keys, time.monotonic
        abandonable = batch.timeout is not None
        items, locks, results, size = batch.items, self._locks, batch.results, batch.size
        claims, completions = batch.claims, batch.completions
        while (index := next(claims)) < size:
            batch.claimed = index + 1
            slot, arg = items[index]
            lock = locks[slot]
            if not lock.acquire(False) and not self._wait_for(lock, batch, index, slot):
                continue
            key = next(keys)
            running[key] = (batch, index, slot, monotonic(), abandonable)
            if watchdog.idle:
                watchdog.wake()
            try:
                result = call(slot, arg, key)
            except Abandoned:  # the watchdog answered for this instance and rebuilt it: touch nothing
                return
            except Exception as err:  # noqa: BLE001 - a fault here must not leave the batch unanswered
                running.pop(key, None)
                result = self._failed(batch.op, slot, f"server fault: {type(err).__name__}: {err}", None)
            lock.release()
            results[index] = result
            if next(completions) == size:
                batch.on_done(results)

    def _wait_for(self, lock: threading.Lock, batch: Batch, index: int, slot: int) -> bool:
        """Wait for a busy instance (an earlier call still runs on it): whether it came free in
        ``INSTANCE_BUSY_WAIT_S``; if not, its result is a "busy" failure."""
        key = self.watchdog.enter(batch, index, slot, abandonable=False)
        acquired = lock.acquire(timeout=INSTANCE_BUSY_WAIT_S)
        self.watchdog.running.pop(key, None)
        if not acquired:
            batch.complete(index, self._failed(batch.op, slot, f"instance {slot + self.first_id} is busy: an "
                                               f"earlier call on it has not returned after "
                                               f"{INSTANCE_BUSY_WAIT_S:g} s; reset it later", None))
        return acquired

    def _returned(self, key: int) -> None:
        """Called as an environment call returns: raises :class:`Abandoned` if the watchdog took it over."""
        if self.watchdog.running.pop(key, None) is None:
            raise Abandoned

    def _abandon(self, batch: Batch, index: int, slot: int, seconds: float) -> None:
        """A call past the timeout (its instance lock still held for it): rebuild, answer, release."""
        try:
            err = InstanceTimeout(f"no answer within {batch.timeout:g} s (call_timeout_s)")
            message, info = self._failure(slot, batch.op, err)
            result = self._failed(batch.op, slot, message, info)
        finally:
            self._locks[slot].release()
        batch.complete(index, result)

    # ----- per-instance work (the instance's lock held) ----------------------------------------
    def _env(self, slot: int) -> TextEnv:
        env = self._envs[slot]
        if env is None:  # an earlier rebuild failed: try again
            env = self._envs[slot] = self._factory()
        return env

    def _failure(self, slot: int, where: str, err: BaseException) -> tuple[str, dict[str, Any]]:
        """Rebuild a failed instance; the error text and the info that reports it."""
        with self._count_lock:
            self.failures += 1
        trace = "".join(traceback.format_exception(err, limit=8))
        message = f"{where} raised {type(err).__name__}: {err}"
        self._active[slot] = False
        try:
            self._envs[slot] = self._factory()
            message += "; the instance was rebuilt"
        except Exception as rebuild_err:  # noqa: BLE001 - reported, retried on the next call
            self._envs[slot] = None
            message += f"; rebuilding it failed ({type(rebuild_err).__name__}: {rebuild_err})"
        task = self._tasks[slot]
        info = {"env_error": message, "env_traceback": trace,
                "won": False, "admissible_actions": [],
                "split": task.split if task else None, "index": task.index if task else None}
        return message, info

    def _failed(self, op: str, slot: int, message: str, info: dict[str, Any] | None) -> dict[str, Any]:
        """The result of an instance whose call failed (``info`` None: no env failure info yet)."""
        instance_id = slot + self.first_id
        if op == "expert":
            return {"instance_id": instance_id, "ok": False, "actions": [], "error": message}
        if info is None:
            info = {"env_error": message, "won": False, "admissible_actions": []}
        if op == "reset":
            return {"instance_id": instance_id, "ok": False, "error": message, "obs": "", "info": info}
        return {"instance_id": instance_id, "ok": False, "error": message, "obs": "", "reward": 0.0,
                "terminated": False, "truncated": True, "info": info}

    def _reset(self, slot: int, task: TaskRef, key: int) -> dict[str, Any]:
        self._tasks[slot] = task
        try:
            obs, info = self._env(slot).reset(task)
        except Exception as err:  # noqa: BLE001 - any env failure is reported, not raised
            self._returned(key)
            return self._failed("reset", slot, *self._failure(slot, "reset", err))
        self._returned(key)
        self._active[slot] = True
        return {"instance_id": slot + self.first_id, "ok": True, "error": None, "obs": obs, "info": jsonable(info)}

    def _step(self, slot: int, action: str, key: int) -> dict[str, Any]:
        if not self._active[slot]:
            self._returned(key)
            return self._failed("step", slot, f"instance {slot + self.first_id} has no running episode: "
                                              "reset it first", None)
        try:
            obs, reward, terminated, truncated, info = self._envs[slot].step(action)
        except Exception as err:  # noqa: BLE001
            self._returned(key)
            return self._failed("step", slot, *self._failure(slot, "step", err))
        if self.watchdog.running.pop(key, None) is None:  # _returned, inlined: the fast path
            raise Abandoned
        return {"instance_id": slot + self.first_id, "ok": True, "error": None, "obs": obs, "reward": float(reward),
                "terminated": bool(terminated), "truncated": bool(truncated), "info": jsonable(info)}

    def _expert(self, slot: int, _: None, key: int) -> dict[str, Any]:
        if not self._active[slot]:
            self._returned(key)
            return self._failed("expert", slot, f"instance {slot + self.first_id} has no running episode: "
                                                "reset it first", None)
        try:
            plan = self._envs[slot].expert_actions()
        except Exception as err:  # noqa: BLE001 - the instance may be fine: no rebuild
            self._returned(key)
            return self._failed("expert", slot, f"expert_actions raised {type(err).__name__}: {err}", None)
        self._returned(key)
        return {"instance_id": slot + self.first_id, "ok": True, "error": None, "actions": [str(a) for a in plan]}

    def close(self) -> None:
        """Close every instance no call is running on (a hung one is left to its thread)."""
        self.watchdog.close()
        self.threads.close()
        for slot, env in enumerate(self._envs):
            if env is not None and self._locks[slot].acquire(timeout=1.0):
                try:
                    env.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass


def shard_sizes(size: int, num_shards: int) -> list[int]:
    """``size`` instances over ``num_shards`` shards, as evenly as possible (first shards larger)."""
    if num_shards <= 0 or num_shards > size:
        raise ValueError(f"need 1..{size} shards for {size} instances, got {num_shards}")
    return [size // num_shards + (1 if i < size % num_shards else 0) for i in range(num_shards)]
