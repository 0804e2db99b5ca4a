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
"""

from __future__ import annotations

import queue
import threading
import traceback
from typing import Any, Callable

from agentrl.envs import make_env
from agentrl.envs.base import MAX_TEXT_LENGTH, TaskRef, TextEnv

OPS = ("reset", "step", "expert", "info")


class BadRequest(ValueError):
    """A request that cannot be served as sent (answered with status 400)."""


class InstanceTimeout(RuntimeError):
    """An environment call ran longer than the pool's ``call_timeout_s``."""


class _CallRunner:
    """Runs environment calls on one daemon thread and waits for each at most ``timeout`` seconds.

    A call that overruns is abandoned (Python cannot stop a thread): its thread is left to finish or
    hang on its own, holding only the instance the pool replaces, and a fresh thread takes over.
    A thread ends when it reads ``None`` from its queue: after its abandoned call, or on close."""

    def __init__(self, timeout: float):
        self.timeout = float(timeout)
        self._start()

    def _start(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, args=(self._jobs,), name="env-call", daemon=True).start()

    @staticmethod
    def _loop(jobs: queue.Queue) -> None:
        while True:
            job = jobs.get()
            if job is None:             # closed, or this thread's call was abandoned
                return
            fn, args, reply = job
            try:
                reply.put((True, fn(*args)))
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                reply.put((False, err))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        reply: queue.Queue = queue.Queue(maxsize=1)
        self._jobs.put((fn, args, reply))
        try:
            ok, value = reply.get(timeout=self.timeout)
        except queue.Empty:
            self._jobs.put(None)        # the abandoned thread ends when its call returns
            self._start()
            raise InstanceTimeout(f"no answer within {self.timeout:g} s (call_timeout_s)") from None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """End the thread once its queued calls are done."""
        self._jobs.put(None)


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
    """``size`` instances of environment ``env_name``, stepped in batches."""

    def __init__(self, env_name: str, size: int, env_kwargs: dict[str, Any] | None = None,
                 first_id: int = 0, factory: Callable[..., TextEnv] | None = None,
                 call_timeout_s: float | None = None):
        if size <= 0:
            raise ValueError(f"pool size must be positive, got {size}")
        self.env_name = env_name
        self.env_kwargs = dict(env_kwargs or {})
        self.first_id = int(first_id)
        self.size = int(size)
        self._factory = factory or (lambda: make_env(env_name, **self.env_kwargs))
        self._envs: list[TextEnv | None] = [self._factory() for _ in range(size)]
        self._active = [False] * size  # an episode is running (reset succeeded, no failure since)
        self._tasks: list[TaskRef | None] = [None] * size
        self.split_sizes = dict(self._envs[0].split_sizes())
        self._lock = threading.Lock()
        self.failures = 0
        self.call_timeout_s = call_timeout_s
        self._runner = _CallRunner(call_timeout_s) if call_timeout_s else None

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, abandoned with :class:`InstanceTimeout` after ``call_timeout_s``."""
        return fn(*args) if self._runner is None else self._runner.call(fn, *args)

    # ----- the JSON API ------------------------------------------------------------------------
    def handle(self, op: str, payload: Any) -> tuple[int, dict[str, Any]]:
        """Serve one request: ``(200, {"results": [...]})`` or ``(400, {"error": message})``."""
        try:
            if op not in OPS:
                raise BadRequest(f"unknown operation {op!r}; expected one of {', '.join(OPS)}")
            if not isinstance(payload, dict):
                raise BadRequest("the request body must be a JSON object")
            if op == "info":
                return 200, self.describe()
            if op == "expert":
                ids = payload.get("instance_ids")
                if not isinstance(ids, list):
                    raise BadRequest("'instance_ids' must be a list of instance ids")
                slots = self._slots(ids)
                with self._lock:
                    return 200, {"results": [self._expert(s) for s in slots]}
            items = payload.get("items")
            if not isinstance(items, list):
                raise BadRequest(f"'items' must be a list of {{'instance_id', "
                                 f"{'task' if op == 'reset' else 'action'}}} objects")
            if op == "reset":
                work = [(slot, self._task(item)) for slot, item in zip(self._item_slots(items), items)]
                with self._lock:
                    return 200, {"results": [self._reset(s, t) for s, t in work]}
            work = [(slot, self._action(item)) for slot, item in zip(self._item_slots(items), items)]
            with self._lock:
                return 200, {"results": [self._step(s, a) for s, a in work]}
        except BadRequest as err:
            return 400, {"error": str(err)}

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

    # ----- per-instance work (under the lock) --------------------------------------------------
    def _env(self, slot: int) -> TextEnv:
        env = self._envs[slot]
        if env is None:  # an earlier rebuild failed: try again
            env = self._envs[slot] = self._factory()
        return env

    def _failure(self, slot: int, where: str, err: BaseException) -> tuple[str, dict[str, Any]]:
        """Rebuild a failed instance; the error text and the info that reports it."""
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

    def _reset(self, slot: int, task: TaskRef) -> dict[str, Any]:
        instance_id = slot + self.first_id
        self._tasks[slot] = task
        try:
            obs, info = self._call(self._env(slot).reset, task)
        except Exception as err:  # noqa: BLE001 - any env failure is reported, not raised
            message, info = self._failure(slot, "reset", err)
            return {"instance_id": instance_id, "ok": False, "error": message, "obs": "", "info": info}
        self._active[slot] = True
        return {"instance_id": instance_id, "ok": True, "error": None, "obs": obs, "info": jsonable(info)}

    def _step(self, slot: int, action: str) -> dict[str, Any]:
        instance_id = slot + self.first_id
        failed = {"instance_id": instance_id, "ok": False, "obs": "", "reward": 0.0,
                  "terminated": False, "truncated": True}
        if not self._active[slot]:
            message = f"instance {instance_id} has no running episode: reset it first"
            return {**failed, "error": message, "info": {"env_error": message, "won": False,
                                                         "admissible_actions": []}}
        try:
            obs, reward, terminated, truncated, info = self._call(self._envs[slot].step, action)
        except Exception as err:  # noqa: BLE001
            message, info = self._failure(slot, "step", err)
            return {**failed, "error": message, "info": info}
        return {"instance_id": instance_id, "ok": True, "error": None, "obs": obs, "reward": float(reward),
                "terminated": bool(terminated), "truncated": bool(truncated), "info": jsonable(info)}

    def _expert(self, slot: int) -> dict[str, Any]:
        instance_id = slot + self.first_id
        if not self._active[slot]:
            return {"instance_id": instance_id, "ok": False, "actions": [],
                    "error": f"instance {instance_id} has no running episode: reset it first"}
        try:
            actions = [str(a) for a in self._envs[slot].expert_actions()]
        except Exception as err:  # noqa: BLE001 - the instance may be fine: no rebuild
            return {"instance_id": instance_id, "ok": False, "actions": [],
                    "error": f"expert_actions raised {type(err).__name__}: {err}"}
        return {"instance_id": instance_id, "ok": True, "error": None, "actions": actions}

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        with self._lock:
            for env in self._envs:
                if env is not None:
                    try:
                        env.close()
                    except Exception:  # noqa: BLE001 - closing is best effort
                        pass


def shard_sizes(size: int, num_shards: int) -> list[int]:
    """``size`` instances over ``num_shards`` shards, as evenly as possible (first shards larger)."""
    if num_shards <= 0 or num_shards > size:
        raise ValueError(f"need 1..{size} shards for {size} instances, got {num_shards}")
    return [size // num_shards + (1 if i < size % num_shards else 0) for i in range(num_shards)]
