"""The pool server as Ray actors: one actor per shard, each holding many environment instances.

One actor per environment instance (verl-agent's layout: 256 processes for 128 + 128 ALFWorld
envs) overloads small machines; here each actor is one process with a whole :class:`EnvPool`
shard, and a pool of N instances over K shards uses K processes (K = the cores to spend on
environments). The actor answers the same JSON-level requests as the HTTP server.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from agentrl.envs.server.pool import EnvPool, shard_sizes
from agentrl.runtime.actor_slots import ActorSlot, actor_options, slot_at


class EnvPoolActor:
    """Ray actor body: one :class:`EnvPool` shard (instance ids ``first_id .. first_id+size-1``)."""

    def __init__(self, env_name: str, size: int, env_kwargs: dict[str, Any] | None, first_id: int,
                 factory: Callable[[], Any] | None = None, call_timeout_s: float | None = None):
        self.pool = EnvPool(env_name, size, env_kwargs, first_id, factory, call_timeout_s)

    def handle(self, op: str, payload: Any) -> tuple[int, dict[str, Any]]:
        return self.pool.handle(op, payload)

    def ready(self) -> bool:
        return True


def launch_ray_shards(env_name: str, size: int, env_kwargs: dict[str, Any] | None = None,
                      num_shards: int = 1, num_cpus_per_shard: float = 1.0,
                      max_restarts: int = 3, factory: Callable[[], Any] | None = None,
                      start_timeout: float = 300.0, call_timeout_s: float | None = None,
                      resources: Sequence[str] = (), slots: Sequence[ActorSlot] | None = None) -> list[Any]:
    """Start ``num_shards`` pool actors (Ray must be initialised) and wait until they are built.

    ``factory`` (optional) builds one instance instead of ``make_env(env_name, **env_kwargs)``:
    for environments registered only in the driver process.

    A shard whose process dies is restarted by Ray (up to ``max_restarts`` times) with fresh
    instances: their next ``step`` reports "no running episode" until they are reset.
    ``call_timeout_s``: see :class:`EnvPool` (a hung reset/step is abandoned, the instance rebuilt).
    ``resources``: a Ray custom resource per shard (repeated when shorter) that places it on a node
    (``placement.env``). ``slots``: one placement-group bundle per shard (the placement plan's env
    bundles, :mod:`agentrl.runtime.actor_slots`) instead.
    """
    import ray

    actor_class = ray.remote(EnvPoolActor)
    sizes = shard_sizes(size, num_shards)
    actors = [actor_class.options(max_restarts=max_restarts, max_task_retries=0,
                                  **actor_options(slot_at(slots, i), num_cpus=num_cpus_per_shard, num_gpus=0,
                                                  resources=resources, index=i)
                                  ).remote(env_name, n, env_kwargs, sum(sizes[:i]), factory, call_timeout_s)
              for i, n in enumerate(sizes)]
    try:
        ray.get([a.ready.remote() for a in actors], timeout=start_timeout)
    except ray.exceptions.GetTimeoutError:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        raise RuntimeError(f"{num_shards} {env_name} pool actors ({num_cpus_per_shard} CPU each) did not start "
                           f"within {start_timeout:.0f} s: is the cluster short of CPUs? "
                           f"(available: {ray.available_resources().get('CPU', 0)})") from None
    return actors
