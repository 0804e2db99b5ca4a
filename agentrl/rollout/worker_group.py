"""``num_workers`` Ray rollout workers behind one handle (:class:`RolloutWorkerGroup`).

    group = RolloutWorkerGroup(model_dir, cfg.rollout, cfg.env, num_workers=2)
    result = group.run(tasks, group_size=8, seed=iteration)     # RolloutResult, ids global
    group.load_weights(state_dict, version=1)                   # any weights, through the packed path
    group.weights_call(PackedPath.Receiver, "load", ...)        # a weight path's receivers (agentrl.weights)
    group.close()

The environments live in pool server actors (:mod:`agentrl.envs.server`), launched by the group
or given to it (running Ray actors, or the URL of ``agentrl envs serve``). The pool's instance
ids are split into W contiguous ranges, one per worker; each call's tasks are split into W
contiguous chunks of whole groups, and every worker numbers its groups and trajectories with the
global ids, so the merged :class:`~agentrl.rollout.engine.RolloutResult` is the same shape as a
single engine's. The same code runs on one box (a local Ray cluster) and across nodes. Calls that
every worker gets the same way go through one fan-out (``_each``); weight loads and the group
stream run in concurrency groups of their own (:mod:`agentrl.rollout.worker_calls`), so they reach a
worker while a rollout call runs.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import ray
import torch

from agentrl.envs.base import TaskRef
from agentrl.envs.server.auth import load_token_file
from agentrl.envs.server.ray_pool import launch_ray_shards
from agentrl.envs.server.servers import spares_per_worker
from agentrl.models import load_tokenizer, stop_token_ids
from agentrl.generation.base import SamplingParams
from agentrl.rollout.engine import RolloutResult, make_sampling_params
from agentrl.rollout.worker_calls import STREAM_GROUP, WEIGHTS_GROUP, PendingRollout
from agentrl.rollout.workers import RolloutWorker, split_evenly
from agentrl.runtime.actor_slots import ActorSlot, actor_options, slot_at
from agentrl.weights import PackedWeights, load_packed

WORKER_SEED_STRIDE = 7919     # worker i samples with seed + i * this


class RolloutWorkerGroup:
    """``num_workers`` Ray rollout workers over one set of env pool servers.

    Env pools: ``env_url`` (an ``agentrl envs serve`` server) or ``env_actors`` (running pool
    actors) when given, else ``env_cfg.num_servers`` pool actors of ``num_envs`` instances in all
    (default ``tasks_per_iteration x group_size``) are launched here and closed with the group:
    Ray restarts a shard whose process dies, and an env call hung for half of ``env.step_timeout_s``
    is abandoned and its instance rebuilt (the engine then re-runs or masks the episode).
    Ray must be initialised. ``worker_num_cpus``/``env_num_cpus`` are the Ray CPU reservations of
    one worker and one env pool shard; ``thread_shares``: what ``rollout.torch_threads=0`` divides
    the cores by (default the workers; the trainer adds one for a learner that runs at the same time);
    ``worker_resources``/``env_resources``: a Ray custom resource per worker / env pool shard that
    places it on a node (``placement.rollout``/``placement.env``); ``worker_slots``/``env_slots``: the
    placement plan's bundles instead (one per worker / shard; a worker's bundle holds its engine's
    tensor-parallel GPUs), see :mod:`agentrl.runtime.actor_slots`.
    """

    def __init__(self, model_dir: str, rollout_cfg, env_cfg, *, num_workers: int | None = None,
                 num_envs: int | None = None, env_kwargs: dict[str, Any] | None = None,
                 env_url: str | None = None, env_actors: Sequence[Any] | None = None, backend: str | None = None,
                 device: str = "cpu", dtype: str = "float32", worker_num_cpus: float = 1.0,
                 env_num_cpus: float = 1.0, num_gpus_per_worker: float = 0.0, torch_threads: int | None = None,
                 stop_strings: Sequence[str] = (), hidden_layer: int | None = None, thread_shares: int | None = None,
                 worker_resources: Sequence[str] = (), env_resources: Sequence[str] = (),
                 worker_slots: Sequence[ActorSlot] | None = None, env_slots: Sequence[ActorSlot] | None = None):
        self.rollout_cfg, self.env_cfg = rollout_cfg, env_cfg
        self.num_workers = int(num_workers or rollout_cfg.num_workers)
        self.num_envs = int(num_envs or env_cfg.tasks_per_iteration * env_cfg.group_size)
        if self.num_envs < self.num_workers:
            raise ValueError(f"{self.num_envs} env instances cannot be split over {self.num_workers} workers")
        self._owned_actors: list[Any] = []
        spares: list[list[int]] = [[] for _ in range(self.num_workers)]
        if env_url is not None:
            env_source: Any = env_url
            load_token_file(env_cfg.server_token_file)   # the servers are probed from here first
            spares = spares_per_worker(env_url, self.num_envs, self.num_workers, env_cfg.step_timeout_s)
        elif env_actors is not None:
            env_source = list(env_actors)
        else:
            kwargs = {"max_steps": env_cfg.max_steps, **dict(env_cfg.kwargs), **dict(env_kwargs or {})}
            self._owned_actors = launch_ray_shards(env_cfg.name, self.num_envs, kwargs,
                                                   num_shards=env_cfg.num_servers, num_cpus_per_shard=env_num_cpus,
                                                   call_timeout_s=env_cfg.step_timeout_s / 2,
                                                   resources=env_resources, slots=env_slots)
            env_source = self._owned_actors
        tokenizer = load_tokenizer(model_dir)
        self.stop_token_ids = tuple(stop_token_ids(tokenizer))
        self.stop_strings = tuple(stop_strings)
        self.instance_ranges = split_evenly(self.num_envs, self.num_workers)
        if torch_threads is None:
            torch_threads = int(getattr(rollout_cfg, "torch_threads", 1))
        # weight loads run in a concurrency group of their own, so that they reach a worker while a
        # rollout call runs (trainer.mode=async); rollout calls run one at a time
        actor_class = ray.remote(concurrency_groups={WEIGHTS_GROUP: 1, STREAM_GROUP: 2})(RolloutWorker)
        self.workers = [actor_class.options(**actor_options(slot_at(worker_slots, i), num_cpus=worker_num_cpus,
                                                            num_gpus=num_gpus_per_worker, resources=worker_resources,
                                                            index=i)).remote(
                            model_dir, rollout_cfg, env_cfg, env_source, list(range(lo, hi)),
                                           backend=backend or rollout_cfg.backend, device=device, dtype=dtype,
                                           seed=i, torch_threads=torch_threads,
                                           num_workers=thread_shares or self.num_workers,
                                           stop_strings=stop_strings,
                                           hidden_layer=hidden_layer, spare_instance_ids=spares[i])
                        for i, (lo, hi) in enumerate(self.instance_ranges)]
        ray.get([w.ready.remote() for w in self.workers])
        self.serve_sessions = 0     # serve_groups calls so far (each a session the workers can be told to stop)

    def sampling_params(self, temperature: float | None = None, seed: int = 0) -> SamplingParams:
        return make_sampling_params(self.rollout_cfg, self.stop_token_ids, self.stop_strings, temperature, seed)

    def run(self, tasks: Sequence[TaskRef], group_size: int, *, sampling: SamplingParams | None = None,
            seed: int = 0, expert_guidance: bool = False) -> RolloutResult:
        """``group_size`` episodes of every task, spread over the workers; one merged result
        (``expert_guidance``: see :meth:`RolloutEngine.run`)."""
        return self.submit(tasks, group_size, sampling=sampling, seed=seed, expert_guidance=expert_guidance).result()

    def submit(self, tasks: Sequence[TaskRef], group_size: int, *, sampling: SamplingParams | None = None,
               seed: int = 0, expert_guidance: bool = False, first_group_id: int = 0) -> "PendingRollout":
        """Start :meth:`run` without waiting: each worker queues its share of the tasks behind the
        calls it already has. Groups are numbered from ``first_group_id`` and trajectories from
        ``first_group_id * group_size``, so the results of several calls have distinct ids."""
        if not tasks:
            raise ValueError("no tasks to roll out")
        sampling = sampling or self.sampling_params(seed=seed)
        calls, workers = [], []
        for w, (lo, hi) in enumerate(split_evenly(len(tasks), self.num_workers)):
            if lo == hi:
                continue
            first = first_group_id + lo
            calls.append(self.workers[w].run.remote(list(tasks[lo:hi]), group_size, list(range(first, first + hi - lo)),
                                                    first * group_size, sampling,
                                                    int(seed) + WORKER_SEED_STRIDE * w, expert_guidance))
            workers.append((w, self.workers[w]))
        return PendingRollout(calls, time.perf_counter(), workers, float(getattr(self.rollout_cfg, "hang_timeout_s", 0.0)))

    def load_weights(self, weights: Mapping[str, torch.Tensor] | Sequence[PackedWeights],
                     version: int | None = None) -> None:
        """Load a ``{name: tensor}`` state dict or packed buckets into every worker's back end (through
        the packed path: each bucket into Ray's object store once, every worker maps it from there).
        ``version``: the policy version of these weights (learner updates applied), stamped on the steps
        generated with them (``StepBatch.policy_version``); None keeps the workers' current number."""
        load_packed(self, weights, version)

    def weights_call(self, receiver: type, method: str, *args: Any, **kwargs: Any) -> list:
        """Start ``method`` of a weight path's receiver on every worker (:meth:`RolloutWorker.weights_call`,
        in the ``weights`` concurrency group, so it reaches a worker while a rollout call runs); the calls
        to :meth:`wait` for."""
        return self._each("weights_call", receiver, method, *args, group=WEIGHTS_GROUP, **kwargs)

    def weights_call_each(self, receiver: type, method: str, args_per_worker: Sequence[Sequence[Any]]) -> list:
        """As :meth:`weights_call`, with worker ``i`` given ``args_per_worker[i]``."""
        return [self._call(w, "weights_call", receiver, method, *args, group=WEIGHTS_GROUP)
                for w, args in zip(self.workers, args_per_worker, strict=True)]

    @staticmethod
    def wait(calls: list) -> list:
        """The results of calls started on the workers (:meth:`weights_call`), in worker order."""
        return ray.get(calls)

    # ----- streaming (agentrl.rollout.sources.streaming) ----------------------------------------------------
    def serve_groups(self, sampling: SamplingParams, group_size: int, seed: int, expert_guidance: bool = False,
                     failure_block: int = 0) -> tuple[int, list]:
        """Start every worker's group pool (:meth:`RolloutWorker.serve_groups`): the session's number
        (for :meth:`stop_serving`) and one call per worker, each giving back the groups it had not
        started once it stops serving."""
        self.serve_sessions += 1
        session = self.serve_sessions
        calls = [w.serve_groups.remote(sampling, group_size, int(seed) + WORKER_SEED_STRIDE * i, expert_guidance,
                                       failure_block, session)
                 for i, w in enumerate(self.workers)]
        return session, calls

    def add_groups(self, worker: int, specs: list, session: int) -> None:
        self._call(self.workers[worker], "add_groups", specs, session, group=STREAM_GROUP)

    def take_groups(self, worker: int, wait_s: float, session: int):
        """A call that gives the groups of ``session`` worker ``worker`` finished (waiting up to ``wait_s``
        for one)."""
        return self._call(self.workers[worker], "take_groups", wait_s, session, group=STREAM_GROUP)

    def stop_serving(self, session: int = 1) -> None:
        self._each("stop_serving", session, group=STREAM_GROUP)

    def gpu_uuids(self) -> list[str]:
        """Every GPU the engines run on (each engine's tensor-parallel GPUs; empty on CPU)."""
        return [uuid for uuids in ray.get(self._each("gpu_uuids")) for uuid in uuids]

    def sleep(self) -> float:
        """Every worker's backend frees its accelerator memory for the learner's passes (vLLM with
        ``rollout.vllm.sleep_level`` > 0; nothing otherwise) until the next weight load; the longest
        worker's seconds."""
        return max(ray.get(self._each("sleep")), default=0.0)

    def backend_stats(self) -> list[dict[str, float]]:
        return ray.get(self._each("backend_stats"))

    # ----- fan-out --------------------------------------------------------------------------------
    @staticmethod
    def _call(worker: Any, method: str, *args: Any, group: str | None = None, **kwargs: Any):
        """Start ``method`` on one worker (in concurrency ``group``, else the rollout calls' queue)."""
        remote = getattr(worker, method)
        if group is not None:
            remote = remote.options(concurrency_group=group)
        return remote.remote(*args, **kwargs)

    def _each(self, method: str, *args: Any, group: str | None = None, **kwargs: Any) -> list:
        """Start ``method`` on every worker; the calls, in worker order."""
        return [self._call(w, method, *args, group=group, **kwargs) for w in self.workers]

    def close(self) -> None:
        for w in self.workers:
            try:
                # in the weights group: a rollout call still running (trainer.mode=async) is not waited for
                ray.get(w.close.options(concurrency_group=WEIGHTS_GROUP).remote(), timeout=30)
            except Exception:  # noqa: BLE001 - the actor is killed below anyway
                pass
            ray.kill(w, no_restart=True)
        for actor in self._owned_actors:
            ray.kill(actor, no_restart=True)
        self.workers, self._owned_actors = [], []

    def __enter__(self) -> "RolloutWorkerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["RolloutWorkerGroup", "WORKER_SEED_STRIDE"]
