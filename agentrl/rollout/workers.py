"""Ray rollout workers: W actors, each with a generation backend and a share of the env instances.

    group = RolloutWorkerGroup(model_dir, cfg.rollout, cfg.env, num_workers=2)
    result = group.run(tasks, group_size=8, seed=iteration)     # RolloutResult, ids global
    group.load_weights(state_dict, version=1)           # any weights, through the packed path
    group.weights_call(PackedPath.Receiver, "load", ...)  # a weight path's receivers (agentrl.weights)
    group.close()

The environments live in pool server actors (:mod:`agentrl.envs.server`), launched by the group
or given to it (running Ray actors, or the URL of ``agentrl envs serve``). The pool's instance
ids are split into W contiguous ranges, one per worker; each call's tasks are split into W
contiguous chunks of whole groups, and every worker numbers its groups and trajectories with the
global ids, so the merged :class:`~agentrl.rollout.engine.RolloutResult` is the same shape as a
single engine's. The same code runs on one box (a local Ray cluster) and across nodes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import ray
import torch

from agentrl.runtime.denormals import denormals_flushed, flush_denormals
from agentrl.runtime.actor_slots import ActorSlot, actor_options, slot_at
from agentrl.envs.base import TaskRef
from agentrl.rollout.backends.base import SamplingParams
from agentrl.rollout.engine import RolloutResult, make_sampling_params
from agentrl.rollout.engines import build_engine
from agentrl.rollout.worker_calls import (STREAM_GROUP, WEIGHTS_GROUP, PendingRollout, RolloutHangError,
                                          check_progress)
from agentrl.weights import PackedWeights, device_uuid, load_packed

WORKER_SEED_STRIDE = 7919


def split_evenly(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``(start, stop)`` ranges covering ``0..count-1``, sizes differing by <= 1."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one, else the
    machine's count)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_torch_threads(num_workers: int) -> int:
    """``rollout.torch_threads=0``: :func:`available_cores` divided by ``num_workers`` (the trainer
    counts the learner as one more worker when both run at once, ``trainer.mode``)."""
    return max(1, available_cores() // max(1, int(num_workers)))


@dataclass
class StagedWeights:
    state: Mapping[str, torch.Tensor]
    version: int | None


class RolloutWorker:
    """One rollout worker (run as a Ray actor by :class:`RolloutWorkerGroup`, or in-process).

    ``env_source`` is a list of env pool actor handles or the URL of an HTTP env server;
    ``instance_ids`` are the pool instances this worker uses. ``torch_threads``: None leaves
    torch's thread count as it is, 0 takes this machine's share for one of ``num_workers`` workers
    (:func:`default_torch_threads`), n > 0 sets n.
    """

    def __init__(self, model_dir: str, rollout_cfg, env_cfg, env_source: Any, instance_ids: Sequence[int], *,
                 backend: str = "torch", device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 torch_threads: int | None = None, num_workers: int = 1, stop_strings: Sequence[str] = (),
                 hidden_layer: int | None = None, spare_instance_ids: Sequence[int] = ()):
        from agentrl.envs.server import EnvClient
        from agentrl.envs.server.auth import export_token_file
        from agentrl.envs.server.servers import connect_env_servers
        from agentrl.models import load_tokenizer, resolve_dtype
        from agentrl.rollout.backends import make_backend

        flush_denormals()    # before torch starts this process's threads
        if torch_threads:
            torch.set_num_threads(int(torch_threads))
        elif torch_threads == 0:    # rollout.torch_threads=0: this machine's cores, shared by the workers
            torch.set_num_threads(default_torch_threads(num_workers))
        self.tokenizer = load_tokenizer(model_dir)
        self.device = device
        self._weight_receivers: dict[str, Any] = {}    # a weight path's receiver per path (weights_call)
        self.backend = make_backend(backend, model_dir, device=device, dtype=resolve_dtype(dtype, device),
                                    max_model_len=rollout_cfg.max_prompt_tokens + rollout_cfg.max_response_tokens,
                                    seed=seed, vllm_cfg=rollout_cfg.vllm)
        # the estimator's RowInputs.hidden_layer: the prefill records each prompt's hidden state (a
        # backend that cannot, vLLM, leaves it to the learner's pass)
        if hidden_layer is not None:
            self.backend.record_hidden(hidden_layer)
        if isinstance(env_source, str):
            export_token_file(env_cfg.server_token_file)   # read on this worker's node
            self.client = connect_env_servers(env_source, env_cfg.step_timeout_s, spare_instance_ids)
            self.env_text = (self.client.describe() if hasattr(self.client, "describe")
                             else f"the env server at {env_source}")
        else:
            self.client = EnvClient.ray_actors(list(env_source), timeout=env_cfg.step_timeout_s)
            self.env_text = f"{len(env_source)} Ray env pool actor(s) of {env_cfg.name}"
        # agentrl's own loop, or an outside agent through the gateway (rollout.agent, docs/agents.md)
        self.engine = build_engine(self.backend, self.tokenizer, self.client, rollout_cfg, env_cfg,
                                   instance_ids=instance_ids, stop_strings=stop_strings)
        # weights that arrive while a rollout runs wait here and are loaded between two env steps
        # (the engine's step boundary), never in the middle of a generate call
        self._weights_lock = threading.Lock()
        self._rolling_out = False
        self._staged: StagedWeights | None = None
        self._last_finished: float | None = None
        self.engine.before_generate = self._load_staged_weights
        if getattr(rollout_cfg, "weights_between_tokens", False) and self.backend.loads_weights_between_tokens:
            self.backend.weights_between_tokens = self._load_staged_between_tokens
        # streaming (serve_groups): groups given to this worker, groups it finished, and the stop flag
        self._stream = threading.Condition()
        self._inbox: list[tuple[int, Any]] = []              # (session, group spec)
        self._outbox: list[tuple[int, RolloutResult]] = []   # (session, finished group)
        self._stopped_session = 0     # serve_groups calls up to this session number are asked to stop
        self._serving = False

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        """Whether a rollout call runs, the policy version loaded, one waiting for a step boundary
        (None if none), and what the engine is doing (``doing``, for ``for_s`` seconds), where;
        answered during a rollout when called in the ``weights`` group."""
        import os

        activity = self.engine.activity
        doing = f"{activity.doing} on {self.env_text}" if activity.env else activity.doing
        with self._weights_lock:
            staged = self._staged.version if self._staged is not None else None
            return {"rolling_out": self._rolling_out, "policy_version": self.engine.policy_version,
                    "staged_version": staged, "doing": doing, "for_s": time.monotonic() - activity.since,
                    "generated_tokens": int(self.backend.stats().get("generated_tokens", 0)),
                    "pid": os.getpid(), "node": ray.util.get_node_ip_address() if ray.is_initialized() else "local"}

    def torch_threads(self) -> int:
        return torch.get_num_threads()

    def denormals_flushed(self) -> bool:
        return denormals_flushed()

    def run(self, tasks: Sequence[TaskRef], group_size: int, group_ids: Sequence[int], traj_id_start: int,
            sampling: SamplingParams, seed: int, expert_guidance: bool = False) -> RolloutResult:
        """One rollout call. Its ``stats`` also say how long this worker had been idle before it
        (``idle_before_s``: waiting for the trainer's next call, e.g. while the learner updated)."""
        flush_denormals()   # this call's thread (Ray may run calls on a thread of its own)
        started = time.perf_counter()
        with self._weights_lock:
            self._rolling_out = True
        try:
            result = self.engine.run(tasks, group_size, sampling=sampling.with_seed(seed), seed=seed,
                                     group_ids=group_ids, traj_id_start=traj_id_start, expert_guidance=expert_guidance)
        finally:
            with self._weights_lock:
                self._rolling_out = False
                self._load_staged_locked()
            self.engine.mark("idle")
        result.stats["idle_before_s"] = started - self._last_finished if self._last_finished is not None else 0.0
        result.stats.update(self._env_server_stats())
        self._last_finished = time.perf_counter()
        return result

    def _env_server_stats(self) -> dict[str, float]:
        """Each env server's failures and moved instances since the last call (several servers only)."""
        stats = getattr(self.client, "server_stats", None)
        return stats() if stats is not None else {}

    # ----- weights: loaded now when idle, else staged for the next step boundary -------------------
    def take_weights(self, state: Mapping[str, torch.Tensor], version: int | None) -> None:
        """Load ``state`` into the back end now, or, while a rollout runs, at the next step boundary
        (between two tokens with ``rollout.weights_between_tokens``); ``version``: the policy version they
        are (recorded on every later step as ``policy_version``; None keeps the current number)."""
        with self._weights_lock:
            self._staged = StagedWeights(state, version)   # a newer sync replaces one not loaded yet
            if not self._rolling_out:
                self._load_staged_locked()

    def load_between_rollouts(self, load: Callable[[], None], version: int | None, why: str) -> None:
        """Run ``load`` now (a load that cannot wait for a step boundary: CUDA IPC handles the learner
        reuses once the push returns); refused while a rollout runs, with ``why``."""
        with self._weights_lock:
            if self._rolling_out:
                raise RuntimeError(f"{why}; use rollout.weight_sync=broadcast with trainer.mode one_step_off or async")
            load()
            if version is not None:
                self.engine.policy_version = int(version)

    def weights_call(self, receiver: type, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` of this worker's receiver of a weight path (:mod:`agentrl.weights`; ``receiver``:
        the path's ``Receiver`` class, built over this worker once and kept: it may hold a process group)."""
        key = f"{receiver.__module__}:{receiver.__qualname__}"
        if key not in self._weight_receivers:
            self._weight_receivers[key] = receiver(self)
        return getattr(self._weight_receivers[key], method)(*args, **kwargs)

    def _load_staged_weights(self) -> None:
        """The engine's step boundary: load weights that arrived during the rollout."""
        with self._weights_lock:
            self._load_staged_locked()

    def _load_staged_between_tokens(self) -> int:
        """Between two tokens of a generate call: load weights that arrived; the version now running."""
        with self._weights_lock:
            if self._staged is not None:
                self._load_staged_locked()
            return self.engine.policy_version

    def _load_staged_locked(self) -> None:
        staged, self._staged = self._staged, None
        if staged is None:
            return
        flush_denormals()
        self.backend.load_weights(staged.state)
        if staged.version is not None:
            self.engine.policy_version = int(staged.version)

    # ----- streaming: whole groups handed back as they finish (trainer.mode=async) ------------------
    def serve_groups(self, sampling: SamplingParams, group_size: int, seed: int, expert_guidance: bool = False,
                     failure_block: int = 0, session: int = 1) -> list:
        """Play the groups :meth:`add_groups` gives, starting each as env instances free up
        (:class:`~agentrl.rollout.group_pool.GroupPool`), until :meth:`stop_serving`; the finished ones
        wait for :meth:`take_groups`. Returns the groups given but not started (after finishing the
        ones that had started). ``session`` numbers the driver's serve calls: a stop for this session
        that reached the worker first (the stop and this call run in different concurrency groups)
        still stops it, and a stop for an older one does not."""
        from agentrl.rollout.group_pool import GroupPool

        flush_denormals()
        pool = GroupPool(self.engine, group_size, sampling, seed, expert_guidance=expert_guidance,
                         failure_block=failure_block)
        with self._stream:
            self._serving = True
        unstarted: list = []
        try:
            while True:
                with self._stream:
                    # this session's groups; an older session's leftovers go, a newer one's wait for it
                    pool.add([spec for owner, spec in self._inbox if owner == session])
                    self._inbox = [(owner, spec) for owner, spec in self._inbox if owner > session]
                    stopping = self._stopped_session >= session
                    if stopping:
                        unstarted += pool.take_waiting()
                    if not pool.busy and not pool.waiting:
                        if stopping:
                            break
                        self._stream.wait(timeout=0.2)
                        continue
                with self._weights_lock:
                    self._rolling_out = True
                try:
                    finished = pool.step()
                finally:
                    if not pool.busy:
                        with self._weights_lock:
                            self._rolling_out = False
                            self._load_staged_locked()
                        self.engine.mark("idle")
                if finished:
                    stats = {**pool.drain_stats(), **self._env_server_stats()}
                    finished[0].stats = {**stats, **finished[0].stats}
                    with self._stream:
                        self._outbox.extend((session, result) for result in finished)
                        self._stream.notify_all()
            return unstarted
        finally:
            with self._weights_lock:
                self._rolling_out = False
            with self._stream:
                self._serving = False
                self._stream.notify_all()

    def add_groups(self, specs: list, session: int = 1) -> None:
        """Groups (:class:`~agentrl.rollout.group_pool.GroupSpec`) for the :meth:`serve_groups` call of
        ``session`` to play (they may arrive before it starts)."""
        with self._stream:
            self._inbox.extend((session, spec) for spec in specs)
            self._stream.notify_all()

    def take_groups(self, wait_s: float, session: int = 1) -> list[RolloutResult]:
        """The groups of ``session`` finished since the last call, waiting up to ``wait_s`` for at least
        one (less when serving ends); an older session's leftovers are dropped."""
        deadline = time.monotonic() + wait_s

        def mine() -> bool:
            return any(owner == session for owner, _ in self._outbox)

        with self._stream:
            while not mine() and self._serving and time.monotonic() < deadline:
                self._stream.wait(timeout=max(0.0, deadline - time.monotonic()))
            taken = [result for owner, result in self._outbox if owner == session]
            self._outbox = [(owner, result) for owner, result in self._outbox if owner > session]
        return taken

    def stop_serving(self, session: int = 1) -> None:
        """Ask :meth:`serve_groups` of ``session`` (and older ones) to finish the groups it started and
        return the others."""
        with self._stream:
            self._stopped_session = max(self._stopped_session, int(session))
            self._stream.notify_all()

    def gpu_uuids(self) -> list[str]:
        """The GPUs this worker's engine runs on (all it sees: its tensor-parallel ranks'; none on CPU)."""
        if self.device.startswith("cuda") and torch.cuda.is_available():
            return [device_uuid(i) for i in range(torch.cuda.device_count())]
        return []

    def sleep(self) -> float:
        """Free the backend's accelerator memory until the next weight load (``rollout.vllm.sleep_level``)."""
        return self.backend.sleep()

    def backend_stats(self) -> dict[str, float]:
        return self.backend.stats()

    def close(self) -> None:
        getattr(self.engine, "close", lambda: None)()
        self.client.close()
        self.backend.close()


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
        from agentrl.envs.server.auth import export_token_file
        from agentrl.envs.server.ray_pool import launch_ray_shards
        from agentrl.envs.server.servers import spares_per_worker
        from agentrl.models import load_tokenizer, stop_token_ids

        self.rollout_cfg, self.env_cfg = rollout_cfg, env_cfg
        self.num_workers = int(num_workers or rollout_cfg.num_workers)
        self.num_envs = int(num_envs or env_cfg.tasks_per_iteration * env_cfg.group_size)
        if self.num_envs < self.num_workers:
            raise ValueError(f"{self.num_envs} env instances cannot be split over {self.num_workers} workers")
        self._owned_actors: list[Any] = []
        spares: list[list[int]] = [[] for _ in range(self.num_workers)]
        if env_url is not None:
            env_source: Any = env_url
            export_token_file(env_cfg.server_token_file)   # the servers are probed from here first
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
        return [w.weights_call.options(concurrency_group=WEIGHTS_GROUP).remote(receiver, method, *args, **kwargs)
                for w in self.workers]

    def weights_call_each(self, receiver: type, method: str, args_per_worker: Sequence[Sequence[Any]]) -> list:
        """As :meth:`weights_call`, with worker ``i`` given ``args_per_worker[i]``."""
        return [w.weights_call.options(concurrency_group=WEIGHTS_GROUP).remote(receiver, method, *args)
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
        self.workers[worker].add_groups.options(concurrency_group=STREAM_GROUP).remote(specs, session)

    def take_groups(self, worker: int, wait_s: float, session: int):
        """A call that gives the groups of ``session`` worker ``worker`` finished (waiting up to ``wait_s``
        for one)."""
        return self.workers[worker].take_groups.options(concurrency_group=STREAM_GROUP).remote(wait_s, session)

    def stop_serving(self, session: int = 1) -> None:
        for w in self.workers:
            w.stop_serving.options(concurrency_group=STREAM_GROUP).remote(session)

    def gpu_uuids(self) -> list[str]:
        """Every GPU the engines run on (each engine's tensor-parallel GPUs; empty on CPU)."""
        return [uuid for uuids in ray.get([w.gpu_uuids.remote() for w in self.workers]) for uuid in uuids]

    def sleep(self) -> float:
        """Every worker's backend frees its accelerator memory for the learner's passes (vLLM with
        ``rollout.vllm.sleep_level`` > 0; nothing otherwise) until the next :meth:`load_weights`;
        the longest worker's seconds."""
        return max(ray.get([w.sleep.remote() for w in self.workers]), default=0.0)

    def backend_stats(self) -> list[dict[str, float]]:
        return ray.get([w.backend_stats.remote() for w in self.workers])

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


__all__ = ["PendingRollout", "RolloutHangError", "STREAM_GROUP", "WEIGHTS_GROUP", "check_progress", "RolloutWorker",
           "RolloutWorkerGroup", "split_evenly"]
