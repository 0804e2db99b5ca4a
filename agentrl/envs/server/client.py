"""One client for every transport of the pool server: in-process, Ray actors, HTTP.

    client = EnvClient.http("http://127.0.0.1:8400")          # or EnvClient.ray("textcraft", 64)
    results = client.reset([(i, TaskRef("train", i // 8)) for i in range(64)])
    results = client.step([(r.instance_id, "inventory") for r in results])

A batch is split by shard and the shards are called concurrently, so a pool sharded over K
processes steps on K cores. Every call has a timeout (the client's default or ``timeout=``); on
timeout :class:`EnvTimeoutError` is raised and the state of the instances in that batch is
unknown: reset them. A malformed request raises :class:`EnvRequestError` (the server's 4xx
message); an unreachable or dead server :class:`EnvServerError`. Failures *inside* an
environment are not exceptions: they come back in that instance's result (``ok`` false,
``error``, ``info["env_error"]``). ``reset``/``step`` with ``on_shard_error="report"`` turn a
dead, unreachable or timed-out shard into such per-instance failures too (the rollout engine's
mode: it re-runs or masks those episodes).
"""

from __future__ import annotations

import bisect
import time
import urllib.parse
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import orjson
import urllib3

from agentrl.envs.base import TaskRef
from agentrl.envs.server.auth import default_token, warn_plain_http
from agentrl.envs.server.pool import EnvPool

DEFAULT_TIMEOUT_S = 120.0
_JSON_HEADERS = {"Content-Type": "application/json"}


class EnvServerError(RuntimeError):
    """The server could not be reached, died, or failed (not a per-instance env failure)."""


class EnvRequestError(EnvServerError):
    """The server rejected the request as malformed (HTTP 4xx); the message says why."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class EnvTimeoutError(EnvServerError):
    """A call did not finish within its timeout."""


@dataclass
class ResetResult:
    instance_id: int
    obs: str
    info: dict[str, Any]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class StepResult:
    instance_id: int
    obs: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


# ----- transports: start(op, payload, timeout) -> ticket; finish(ticket, timeout) -> (status, body) --
class LocalTransport:
    """A pool in this process (tests, benchmarks, single-process tools)."""

    def __init__(self, pool: EnvPool):
        self.pool = pool

    def start(self, op: str, payload: Any, timeout: float) -> Any:
        return self.pool.handle(op, payload)

    def finish(self, ticket: Any, timeout: float) -> tuple[int, dict[str, Any]]:
        return ticket

    def close(self) -> None:
        self.pool.close()


class RayTransport:
    def __init__(self, actor: Any, owned: bool = False):
        self.actor, self.owned = actor, owned

    def start(self, op: str, payload: Any, timeout: float) -> Any:
        return self.actor.handle.remote(op, payload)

    def finish(self, ticket: Any, timeout: float) -> tuple[int, dict[str, Any]]:
        import ray

        try:
            return ray.get(ticket, timeout=timeout)
        except ray.exceptions.GetTimeoutError as err:
            ray.cancel(ticket, force=False)
            raise EnvTimeoutError(f"env pool actor did not answer within {timeout:.1f} s") from err
        except ray.exceptions.RayActorError as err:
            raise EnvServerError(f"env pool actor died: {err}") from err

    def close(self) -> None:
        if self.owned:
            import ray

            ray.kill(self.actor, no_restart=True)


class HttpTransport:
    """Keep-alive connections to one server process through a ``urllib3`` connection pool (JSON over
    HTTP/1.1, ``TCP_NODELAY``; ``scheme="https"`` for a server with TLS, verified against the system's
    certificates or ``$SSL_CERT_FILE``). ``token``: sent as ``Authorization: Bearer <token>`` on
    every request (default: ``env.server_token_file`` as read in this process, else
    ``$AGENTRL_ENV_TOKEN``; none when neither is set); over plain HTTP to another machine it warns
    once (:func:`~agentrl.envs.server.auth.warn_plain_http`).

    The call's timeout bounds connecting and every read (and, for a call on the executor,
    :meth:`finish` the whole call; ``start(here=True)`` calls on the caller's thread). A kept
    connection the server closed meanwhile is noticed before reuse and replaced; a request whose
    connection failed under it is sent once more on a fresh one, except ``step`` (not idempotent: it
    may have been applied). Proxy variables of the environment are ignored: env servers are reached
    directly. Requests and redirects are never retried by urllib3 itself.
    """

    def __init__(self, host: str, port: int, executor: ThreadPoolExecutor | None, token: str | None = None,
                 scheme: str = "http"):
        self.host, self.port, self.executor = host, port, executor
        self.url = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
        pool_class = urllib3.HTTPSConnectionPool if scheme == "https" else urllib3.HTTPConnectionPool
        self._http = pool_class(host, port, maxsize=8, block=False, retries=False)
        token = token if token is not None else default_token()
        if token and scheme == "http":
            warn_plain_http(host, port)
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._get_headers = auth or None
        self._post_headers = {**_JSON_HEADERS, **auth}

    def request(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, dict[str, Any]]:
        data = None if body is None else orjson.dumps(body)
        headers = self._post_headers if data is not None else self._get_headers
        where = f"{self.url}{path}"
        for attempt in (1, 2):
            try:
                response = self._http.urlopen(method, path, body=data, headers=headers, retries=False,
                                              redirect=False, assert_same_host=False,
                                              timeout=urllib3.Timeout(connect=timeout, read=timeout))
                break
            except urllib3.exceptions.NewConnectionError as err:  # refused, unreachable (before the timeouts:
                raise EnvServerError(f"{where}: {err}") from err  # urllib3 derives it from ConnectTimeoutError)
            except urllib3.exceptions.TimeoutError as err:
                raise EnvTimeoutError(f"{where} did not answer within {timeout:.1f} s") from err
            except urllib3.exceptions.ProtocolError as err:  # the connection broke under the request
                if attempt == 2 or path == "/step":
                    raise EnvServerError(f"{where}: {type(err).__name__}: {err}") from err
            except urllib3.exceptions.HTTPError as err:
                raise EnvServerError(f"{where}: {type(err).__name__}: {err}") from err
        try:
            reply = orjson.loads(response.data)
        except orjson.JSONDecodeError as err:
            raise EnvServerError(f"{where}: the reply is not JSON (status {response.status})") from err
        return response.status, reply

    runs_here = True  # start(..., here=True) works on the caller's thread (no hand-over to the executor)

    def start(self, op: str, payload: Any, timeout: float, here: bool = False) -> Future:
        if not here:
            return self.executor.submit(self.request, "POST", f"/{op}", payload, timeout)
        ticket: Future = Future()
        try:
            ticket.set_result(self.request("POST", f"/{op}", payload, timeout))
        except Exception as err:  # noqa: BLE001 - raised by finish(), as from the executor
            ticket.set_exception(err)
        return ticket

    def finish(self, ticket: Future, timeout: float) -> tuple[int, dict[str, Any]]:
        try:
            return ticket.result(timeout=timeout)
        except FutureTimeout as err:
            raise EnvTimeoutError(f"{self.url} did not answer within {timeout:.1f} s") from err

    def close(self) -> None:
        self._http.close()


def _shard_failure(instance_id: int, message: str) -> dict[str, Any]:
    """The result of an instance whose shard failed: its state is unknown, its episode is over."""
    return {"instance_id": instance_id, "ok": False, "error": message, "obs": "", "reward": 0.0,
            "terminated": False, "truncated": True,
            "info": {"env_error": message, "won": False, "admissible_actions": [], "server_failure": True}}


# ----- the client ------------------------------------------------------------------------------
class EnvClient:
    """Batched reset/step over one or more pool shards that together hold ids ``0 .. size-1``."""

    def __init__(self, shards: Sequence[tuple[int, int, Any]], timeout: float = DEFAULT_TIMEOUT_S,
                 info: dict[str, Any] | None = None, executor: ThreadPoolExecutor | None = None):
        """``shards``: ``(first_id, size, transport)`` triples."""
        self._shards = sorted(shards, key=lambda s: s[0])
        self._starts = [s[0] for s in self._shards]
        self.size = sum(s[1] for s in self._shards)
        if self._starts != [sum(s[1] for s in self._shards[:i]) for i in range(len(self._shards))]:
            raise ValueError(f"shards do not cover ids 0..{self.size - 1} contiguously: "
                             f"{[(s[0], s[1]) for s in self._shards]}")
        self.timeout = float(timeout)
        self._executor = executor
        self.info = info if info is not None else self._call_one(self._shards[0][2], "info", {}, self.timeout)
        self.env_name = self.info["env"]
        self.split_sizes = self.info["split_sizes"]

    # ----- constructors ------------------------------------------------------------------------
    @classmethod
    def local(cls, env_name: str, size: int, env_kwargs: dict[str, Any] | None = None,
              timeout: float = DEFAULT_TIMEOUT_S) -> "EnvClient":
        return cls([(0, size, LocalTransport(EnvPool(env_name, size, env_kwargs)))], timeout)

    @classmethod
    def ray(cls, env_name: str, size: int, env_kwargs: dict[str, Any] | None = None, num_shards: int = 1,
            num_cpus_per_shard: float = 1.0, timeout: float = DEFAULT_TIMEOUT_S,
            factory: Callable[[], Any] | None = None) -> "EnvClient":
        """Start ``num_shards`` pool actors (closed with the client) and connect to them."""
        from agentrl.envs.server.ray_pool import launch_ray_shards    # Ray only where Ray pools are asked for: agent processes use HTTP

        actors = launch_ray_shards(env_name, size, env_kwargs, num_shards, num_cpus_per_shard, factory=factory)
        return cls.ray_actors(actors, timeout, owned=True)

    @classmethod
    def ray_actors(cls, actors: Sequence[Any], timeout: float = DEFAULT_TIMEOUT_S,
                   owned: bool = False) -> "EnvClient":
        """Connect to running pool actors (``owned``: kill them on :meth:`close`)."""
        transports = [RayTransport(a, owned) for a in actors]
        infos = [cls._call_one(t, "info", {}, timeout) for t in transports]
        return cls([(i["first_id"], i["size"], t) for i, t in zip(infos, transports)], timeout, infos[0])

    @classmethod
    def http(cls, url: str, timeout: float = DEFAULT_TIMEOUT_S, token: str | None = None) -> "EnvClient":
        """Connect to ``agentrl envs serve`` at ``url`` (``http://`` or ``https://``) and to all of its
        shard processes; ``token``: the server's shared token (default: as :class:`HttpTransport`)."""
        parsed = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname or not parsed.port:
            raise ValueError(f"expected a URL like http://127.0.0.1:8400, got {url!r}")
        probe = HttpTransport(parsed.hostname, parsed.port, None, token, parsed.scheme)
        try:
            status, info = probe.request("GET", "/info", None, timeout)
        finally:
            probe.close()
        if status != 200:
            raise EnvServerError(f"{url}/info answered {status}: {info.get('error')}")
        listed = info.get("shards") or [{"port": parsed.port, "first_id": info["first_id"], "size": info["size"]}]
        executor = ThreadPoolExecutor(max_workers=len(listed), thread_name_prefix="env-client")
        shards = [(s["first_id"], s["size"], HttpTransport(parsed.hostname, s["port"], executor, token, parsed.scheme))
                  for s in listed]
        return cls(shards, timeout, info, executor)

    # ----- calls -------------------------------------------------------------------------------
    @staticmethod
    def _call_one(transport: Any, op: str, payload: Any, timeout: float) -> dict[str, Any]:
        return EnvClient._checked(op, *transport.finish(transport.start(op, payload, timeout), timeout))

    @staticmethod
    def _checked(op: str, status: int, body: Any) -> dict[str, Any]:
        if status == 200:
            return body
        message = body.get("error", "") if isinstance(body, dict) else str(body)
        if 400 <= status < 500:
            raise EnvRequestError(status, message)
        raise EnvServerError(f"{op}: server answered {status}: {message}")

    def _shard_of(self, instance_id: Any) -> int:
        if not isinstance(instance_id, int) or isinstance(instance_id, bool) or not 0 <= instance_id < self.size:
            raise EnvRequestError(400, f"unknown instance id {instance_id!r}: this pool holds 0..{self.size - 1}")
        return bisect.bisect_right(self._starts, instance_id) - 1

    def _fan_out(self, op: str, ids: list[int], payload_for: Callable[[list[int]], dict[str, Any]],
                 timeout: float | None, on_shard_error: str = "raise",
                 per_instance_s: float = 0.0) -> list[dict[str, Any]]:
        """Send each shard its part of the batch (``payload_for(positions)``), concurrently; the
        results come back in request order. A shard has ``timeout`` plus ``per_instance_s`` for
        each instance of the batch it serves (it works through them one by one). With
        ``on_shard_error="report"`` a shard that is dead, unreachable or too slow gives a failed
        result (``ok`` false, ``error``) for each of its instances instead of raising, so the other
        shards' results are kept; a malformed request (:class:`EnvRequestError`) raises either way."""
        if on_shard_error not in ("raise", "report"):
            raise ValueError(f"on_shard_error must be 'raise' or 'report', got {on_shard_error!r}")
        timeout = self.timeout if timeout is None else float(timeout)
        parts: dict[int, list[int]] = {}
        for position, instance_id in enumerate(ids):
            parts.setdefault(self._shard_of(instance_id), []).append(position)
        start = time.monotonic()
        tickets = []
        for n, (shard, positions) in enumerate(parts.items()):
            transport = self._shards[shard][2]
            allowed = timeout + per_instance_s * len(positions)
            if n == len(parts) - 1 and getattr(transport, "runs_here", False):
                # the last shard is called from this thread while the others run: one thread hand-over less
                ticket = transport.start(op, payload_for(positions), allowed, here=True)
            else:
                ticket = transport.start(op, payload_for(positions), allowed)
            tickets.append((positions, transport, ticket))
        results: list[dict[str, Any]] = [{}] * len(ids)
        for positions, transport, ticket in tickets:
            deadline = start + timeout + per_instance_s * len(positions)
            try:
                status, body = transport.finish(ticket, max(0.001, deadline - time.monotonic()))
                replies = self._checked(op, status, body)["results"]
            except EnvRequestError:
                raise
            except EnvServerError as err:
                if on_shard_error == "raise":
                    raise
                replies = [_shard_failure(ids[p], f"{op}: {err}") for p in positions]
            for position, result in zip(positions, replies):
                results[position] = result
        return results

    def reset(self, items: Sequence[tuple[int, TaskRef | dict[str, Any]]],
              timeout: float | None = None, on_shard_error: str = "raise",
              per_instance_s: float = 0.0) -> list[ResetResult]:
        """Start the given task on each instance: ``[(instance_id, TaskRef), ...]``. A shard may take
        ``timeout`` plus ``per_instance_s`` per instance it resets."""
        entries = [{"instance_id": i, "task": t.to_dict() if isinstance(t, TaskRef) else t} for i, t in items]
        results = self._fan_out("reset", [e["instance_id"] for e in entries],
                                lambda positions: {"items": [entries[p] for p in positions]}, timeout,
                                on_shard_error, per_instance_s)
        return [ResetResult(r["instance_id"], r["obs"], r["info"], r.get("error")) for r in results]

    def step(self, items: Sequence[tuple[int, str]], timeout: float | None = None,
             on_shard_error: str = "raise") -> list[StepResult]:
        """Apply one action on each instance: ``[(instance_id, action_text), ...]``."""
        entries = [{"instance_id": i, "action": a} for i, a in items]
        results = self._fan_out("step", [e["instance_id"] for e in entries],
                                lambda positions: {"items": [entries[p] for p in positions]}, timeout,
                                on_shard_error)
        return [StepResult(r["instance_id"], r["obs"], r["reward"], r["terminated"], r["truncated"],
                           r["info"], r.get("error")) for r in results]

    def expert_actions(self, instance_ids: Sequence[int], timeout: float | None = None) -> list[list[str]]:
        """The expert's plan of each instance (from the state right after its last reset)."""
        ids = list(instance_ids)
        results = self._fan_out("expert", ids, lambda positions: {"instance_ids": [ids[p] for p in positions]},
                                timeout)
        for result in results:
            if result.get("error"):
                raise EnvServerError(f"instance {result['instance_id']}: {result['error']}")
        return [result["actions"] for result in results]

    def close(self) -> None:
        for _, _, transport in self._shards:
            transport.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def __enter__(self) -> "EnvClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
