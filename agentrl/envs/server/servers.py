"""Env instances spread over several env servers, with fail-over (``env.server_url`` naming more than one).

    servers = parse_server_spec("http://a:8400, http://b:8400 max=64")   # or "@/shared/env_servers.txt"
    client = ServerSet.connect(servers, timeout=60, spare_ids=range(128, 160))
    client.reset(...); client.step(...)                 # the calls of EnvClient, on routed ids

**The spec.** ``env.server_url`` is one URL (one server: :meth:`EnvClient.http`, as before), several
separated by commas, or ``@path`` to a file that lists one per line (``#`` starts a comment). Each
entry is ``URL`` or ``URL max=N``: at most N of that server's instances are used (default: all it
holds).

**Routing.** The rollout's instance ids are *routed ids* ``0 .. capacity-1``, dealt round robin over
the servers (id 0 on the first server, id 1 on the second, ...; a server that reached its cap or its
size is skipped), so consecutive ids, and each rollout worker's share of them, are spread over every
server. Ids the rollout does not use (``capacity`` minus the instances it needs) are *spares*, split
between the rollout workers (:func:`spare_ids_of_worker`: each worker gets spares on every server),
so no two workers ever route to the same server instance.

**Fail-over.** A batch that a server could not answer (dead, unreachable, a broken connection) comes
back as failed results for those instances, as with one server (the rollout engine re-runs those
episodes). The server's ``/health`` is then probed: one that answers (a shard restarted on its port)
keeps its instances; one that does not is marked down and each of this client's ids routed to it
moves to a spare on a live server, so the re-run resets there; a reset is retried at once on the new
route (a reset can be repeated, a step cannot). Without a spare left the ids stay where they are and
their episodes keep failing until ``rollout.max_env_failures`` stops the run with one line. A
down server is probed again after :data:`RECHECK_S` and, once it answers, its instances serve as
spares again.

**Health** (:meth:`ServerSet.server_stats`, logged per iteration as ``env/server<i>_*``): whether each
server is down, the instances that failed on it and those moved off it.
"""

from __future__ import annotations

import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from agentrl.envs.server.client import (DEFAULT_TIMEOUT_S, EnvClient, EnvRequestError, EnvServerError,
                                        HttpTransport, ResetResult, StepResult)
from agentrl.errors import UsageError

RECHECK_S = 30.0        # a server marked down is probed again after this
HEALTH_TIMEOUT_S = 3.0  # how long a health probe waits


@dataclass(frozen=True)
class ServerEntry:
    url: str
    max_instances: int | None = None     # None: every instance the server holds


def _parse_entry(text: str, where: str) -> ServerEntry:
    parts = text.split()
    url, options = parts[0], parts[1:]
    parsed = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not parsed.port:
        raise UsageError(f"{where}: expected an env server like http://10.0.0.5:8400 [max=N], got {text!r}")
    cap = None
    for option in options:
        key, _, value = option.partition("=")
        if key != "max" or not value.isdigit() or int(value) < 1:
            raise UsageError(f"{where}: unknown option {option!r} after {url}; the only option is max=N (N >= 1), "
                             "the most instances of that server to use")
        cap = int(value)
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return ServerEntry(f"{parsed.scheme}://{host}:{parsed.port}", cap)


def parse_server_spec(spec: str | Sequence[str]) -> list[ServerEntry]:
    """``env.server_url``: one URL, several separated by commas, or ``@file`` listing one per line."""
    if not isinstance(spec, str):
        entries = [str(s) for s in spec]
        where = "env.server_url"
    elif spec.strip().startswith("@"):
        path = Path(spec.strip()[1:]).expanduser()
        if not path.is_file():
            raise UsageError(f"env.server_url={spec}: no such file; list one env server per line "
                             "(http://host:port [max=N]) in it, or give the URLs separated by commas")
        entries = [line.split("#", 1)[0] for line in path.read_text().splitlines()]
        where = str(path)
    else:
        entries = spec.split(",")
        where = "env.server_url"
    servers = [_parse_entry(e.strip(), where) for e in entries if e.strip()]
    if not servers:
        raise UsageError(f"{where} names no env server: give http://host:port (several separated by commas)")
    seen = [s.url for s in servers]
    duplicates = sorted({u for u in seen if seen.count(u) > 1})
    if duplicates:
        raise UsageError(f"{where} names {', '.join(duplicates)} more than once: list each env server once "
                         "(max=N sets how many of its instances to use)")
    return servers


def names_several_servers(spec: str | Sequence[str] | None) -> bool:
    """Whether ``env.server_url`` goes through :class:`ServerSet` (a list or a file) rather than one URL."""
    if spec is None:
        return False
    return not isinstance(spec, str) or spec.strip().startswith("@") or "," in spec


def deal_round_robin(capacities: Sequence[int]) -> list[tuple[int, int]]:
    """Routed id -> ``(server index, server-local id)``: ids dealt over the servers in turn, each server
    taking at most its capacity."""
    routes, used = [], [0] * len(capacities)
    while len(routes) < sum(capacities):
        for server, capacity in enumerate(capacities):
            if used[server] < capacity:
                routes.append((server, used[server]))
                used[server] += 1
    return routes


def spare_ids_of_worker(routes: Sequence[tuple[int, int]], needed: int, worker: int, num_workers: int) -> list[int]:
    """The spare routed ids (``needed ..``) of rollout worker ``worker`` of ``num_workers``: each server's
    spares dealt over the workers in turn, so every worker has spares on every server that has some."""
    by_server: dict[int, list[int]] = {}
    for routed in range(needed, len(routes)):
        by_server.setdefault(routes[routed][0], []).append(routed)
    return sorted(i for ids in by_server.values() for i in ids[worker::num_workers])


@dataclass
class _Server:
    url: str
    client: EnvClient | None
    size: int
    down_since: float | None = None
    last_error: str = ""
    failed_instances: int = 0
    moved_instances: int = 0
    checked_at: float = 0.0
    reported: tuple[int, int] = (0, 0)     # failed and moved instances at the last server_stats()


class ServerSet:
    """:class:`EnvClient`'s calls (``reset``, ``step``, ``expert_actions``, ``size``) over routed ids on
    several env servers, with fail-over to spare instances (module docstring)."""

    def __init__(self, servers: list[_Server], caps: Sequence[int], timeout: float,
                 spare_ids: Iterable[int] = ()):
        self.servers, self.timeout = servers, float(timeout)
        self.routes = deal_round_robin(caps)
        self.size = len(self.routes)
        self.spares = [i for i in spare_ids if 0 <= i < self.size]
        self.used: set[int] = set()          # the routed ids this client was called with
        first = next(s.client for s in servers if s.client is not None)
        self.info, self.env_name, self.split_sizes = first.info, first.env_name, first.split_sizes
        self._pool = ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="env-servers")

    @classmethod
    def connect(cls, entries: Sequence[ServerEntry], timeout: float = DEFAULT_TIMEOUT_S,
                spare_ids: Iterable[int] = ()) -> "ServerSet":
        """Connect to every server (each must answer now: a run starts on servers that are up)."""
        servers, caps = [], []
        for entry in entries:
            try:
                client = EnvClient.http(entry.url, timeout=timeout)
            except EnvServerError as err:
                raise EnvServerError(f"env server {entry.url} (env.server_url) does not answer: {err}") from err
            servers.append(_Server(entry.url, client, client.size))
            caps.append(min(client.size, entry.max_instances or client.size))
        names = {s.client.env_name for s in servers}
        if len(names) > 1:
            raise UsageError(f"the env servers of env.server_url serve different environments ({sorted(names)}): "
                             "give servers of one environment")
        return cls(servers, caps, timeout, spare_ids)

    # ----- calls ---------------------------------------------------------------------------------
    def _check(self, routed_id: Any) -> tuple[int, int]:
        if not isinstance(routed_id, int) or isinstance(routed_id, bool) or not 0 <= routed_id < self.size:
            raise EnvRequestError(400, f"unknown instance id {routed_id!r}: these env servers hold 0..{self.size - 1}")
        return self.routes[routed_id]

    def _call(self, ids: list[int], call: Callable[[EnvClient, list[int], list[int]], list[Any]]) -> list[Any]:
        """``call(client, local_ids, positions)`` on each server for its part of ``ids``, concurrently;
        the results in request order, each carrying its routed id."""
        parts: dict[int, list[int]] = {}
        for position, routed in enumerate(ids):
            parts.setdefault(self._check(routed)[0], []).append(position)
        self.used.update(ids)
        futures = {server: self._pool.submit(call, self.servers[server].client,
                                             [self.routes[ids[p]][1] for p in positions], positions)
                   for server, positions in parts.items()}
        results: list[Any] = [None] * len(ids)
        for server, future in futures.items():
            for position, result in zip(parts[server], future.result()):
                result.instance_id = ids[position]
                results[position] = result
        return results

    def _server_failures(self, ids: list[int], results: Sequence[Any]) -> set[int]:
        """The servers whose part of a batch failed as a whole (not inside an environment)."""
        failed: set[int] = set()
        for routed, result in zip(ids, results):
            if not result.ok and result.info.get("server_failure"):
                server = self.routes[routed][0]
                self.servers[server].failed_instances += 1
                self.servers[server].last_error = result.error or ""
                failed.add(server)
        return failed

    def _healthy(self, server: _Server) -> bool:
        parsed = urllib.parse.urlsplit(server.url)
        probe = HttpTransport(parsed.hostname, parsed.port, None, scheme=parsed.scheme)   # the token: default_token()
        try:
            status, _ = probe.request("GET", "/health", None, HEALTH_TIMEOUT_S)
            return status == 200
        except EnvServerError:
            return False
        finally:
            probe.close()

    def _fail_over(self, failed: set[int]) -> set[int]:
        """Mark the failed servers that do not answer ``/health`` down and move this client's ids off
        them onto spares of live servers; the routed ids moved."""
        now = time.monotonic()
        for index in failed:
            server = self.servers[index]
            server.checked_at = now
            if self._healthy(server):
                continue
            server.down_since = server.down_since or now
        self._recheck_down(now)
        moved: set[int] = set()
        spare_set = set(self.spares)
        for routed in sorted(self.used - spare_set):
            server = self.servers[self.routes[routed][0]]
            if server.down_since is None:
                continue
            spare = next((i for i in self.spares if self.servers[self.routes[i][0]].down_since is None), None)
            if spare is None:
                break
            # the spare id now points at the down server's instance (usable again once it is back)
            self.routes[routed], self.routes[spare] = self.routes[spare], self.routes[routed]
            server.moved_instances += 1
            moved.add(routed)
        return moved

    def _recheck_down(self, now: float) -> None:
        for server in self.servers:
            if server.down_since is not None and now - server.checked_at >= RECHECK_S:
                server.checked_at = now
                if self._healthy(server):
                    server.down_since = None

    def reset(self, items: Sequence[tuple[int, Any]], timeout: float | None = None, on_shard_error: str = "raise",
              per_instance_s: float = 0.0) -> list[ResetResult]:
        """:meth:`EnvClient.reset` on routed ids; instances of a server that died are reset again at
        once on a spare of a live server."""
        items = list(items)
        ids = [i for i, _ in items]
        tasks = {i: t for i, t in items}

        def call(client: EnvClient, local: list[int], positions: list[int]) -> list[ResetResult]:
            return client.reset([(lid, items[p][1]) for lid, p in zip(local, positions)], timeout,
                                on_shard_error, per_instance_s)

        results = self._call(ids, call)
        failed = self._server_failures(ids, results)
        if failed:
            moved = self._fail_over(failed)
            retry = [i for i in ids if i in moved]
            if retry:
                again = self._call(retry, lambda client, local, positions: client.reset(
                    [(lid, tasks[retry[p]]) for lid, p in zip(local, positions)], timeout, on_shard_error,
                    per_instance_s))
                by_id = {r.instance_id: r for r in again}
                results = [by_id.get(r.instance_id, r) for r in results]
        return results

    def step(self, items: Sequence[tuple[int, str]], timeout: float | None = None,
             on_shard_error: str = "raise") -> list[StepResult]:
        """:meth:`EnvClient.step` on routed ids (a step on a server that died fails; its episode is re-run
        from a reset that goes to a live server)."""
        items = list(items)
        ids = [i for i, _ in items]
        results = self._call(ids, lambda client, local, positions: client.step(
            [(lid, items[p][1]) for lid, p in zip(local, positions)], timeout, on_shard_error))
        failed = self._server_failures(ids, results)
        if failed:
            self._fail_over(failed)
        return results

    def expert_actions(self, instance_ids: Sequence[int], timeout: float | None = None) -> list[list[str]]:
        ids = list(instance_ids)
        parts: dict[int, list[int]] = {}
        for position, routed in enumerate(ids):
            parts.setdefault(self._check(routed)[0], []).append(position)
        plans: list[list[str]] = [[] for _ in ids]
        for server, positions in parts.items():
            local = [self.routes[ids[p]][1] for p in positions]
            for position, plan in zip(positions, self.servers[server].client.expert_actions(local, timeout)):
                plans[position] = plan
        return plans

    def server_stats(self) -> dict[str, float]:
        """Per server ``i`` (in ``env.server_url`` order) since the last call: ``env_server<i>_failed``
        (instances whose batch it could not answer), ``env_server<i>_moved`` (instances moved off it);
        and ``max_env_server<i>_down``, 1 while it is marked down (a down server is probed again here
        once :data:`RECHECK_S` passed)."""
        self._recheck_down(time.monotonic())
        stats: dict[str, float] = {}
        for i, server in enumerate(self.servers):
            stats[f"env_server{i}_failed"] = float(server.failed_instances - server.reported[0])
            stats[f"env_server{i}_moved"] = float(server.moved_instances - server.reported[1])
            stats[f"max_env_server{i}_down"] = float(server.down_since is not None)
            server.reported = (server.failed_instances, server.moved_instances)
        return stats

    def describe(self) -> str:
        return f"{len(self.servers)} env servers ({', '.join(s.url for s in self.servers)})"

    def close(self) -> None:
        for server in self.servers:
            if server.client is not None:
                server.client.close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> "ServerSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect_env_servers(spec: str | Sequence[str], timeout: float = DEFAULT_TIMEOUT_S,
                        spare_ids: Iterable[int] = ()) -> EnvClient | ServerSet:
    """One URL: :meth:`EnvClient.http`; several (or ``@file``): a :class:`ServerSet`."""
    if not names_several_servers(spec):
        return EnvClient.http(str(spec).strip(), timeout=timeout)
    return ServerSet.connect(parse_server_spec(spec), timeout, spare_ids)


def spares_per_worker(spec: str | Sequence[str], needed: int, num_workers: int,
                      timeout: float = DEFAULT_TIMEOUT_S) -> list[list[int]]:
    """Each rollout worker's spare ids when ``spec`` names several servers (none for one URL); refused
    in one line when the servers hold fewer instances than the rollout needs."""
    if not names_several_servers(spec):
        return [[] for _ in range(num_workers)]
    with ServerSet.connect(parse_server_spec(spec), timeout) as servers:
        capacity, described, routes = servers.size, servers.describe(), list(servers.routes)
    if capacity < needed:
        raise UsageError(f"{described} hold {capacity} env instances in all (max=N applied) but a rollout needs "
                         f"{needed} (env.tasks_per_iteration x env.group_size): start more or larger env servers, "
                         "or raise their max=")
    return [spare_ids_of_worker(routes, needed, w, num_workers) for w in range(num_workers)]


__all__ = ["RECHECK_S", "ServerEntry", "ServerSet", "connect_env_servers", "deal_round_robin",
           "names_several_servers", "parse_server_spec", "spare_ids_of_worker", "spares_per_worker"]
