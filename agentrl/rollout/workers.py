"""Ray rollout workers: W actors, each with a generation backend and a share of the env instances.

    group = RolloutWorkerGroup(model_dir, cfg.rollout, cfg.env, num_workers=2)
    result = group.run(tasks, group_size=8, seed=iteration)     # RolloutResult, ids global
    group.load_weights(learner.packed_weights_for_rollout(), version=1)   # each bucket stored once, mapped by all
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
from typing import Any, Mapping, Sequence

import torch

from agentrl.runtime.denormals import denormals_flushed, flush_denormals
from agentrl.runtime.actor_slots import ActorSlot, actor_options, slot_at
from agentrl.envs.base import TaskRef
from agentrl.generation import SamplingParams, make_backend
from agentrl.rollout.engine import RolloutEngine, RolloutResult, make_sampling_params
from agentrl.rollout.worker_calls import (STREAM_GROUP, WEIGHTS_GROUP, PendingRollout, RolloutHangError,
                                          check_progress)
from agentrl.weights.transfer import (BroadcastLayout, IpcWeights, PackedWeights, WeightBroadcast, as_buckets,
                                             device_uuid, unpack_weights)

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
                 backend: str | None = None, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 torch_threads: int | None = None, num_workers: int = 1, stop_strings: Sequence[str] = (),
                 hidden_layer: int | None = None, spare_instance_ids: Sequence[int] = ()):
        from agentrl.envs.server import EnvClient
        from agentrl.envs.server.auth import export_token_file
        from agentrl.envs.server.servers import connect_env_servers
        from agentrl.models import load_tokenizer, resolve_dtype

        flush_denormals()    # before torch starts this process's threads
        if torch_threads:
            torch.set_num_threads(int(torch_threads))
        elif torch_threads == 0:    # rollout.torch_threads=0: this machine's cores, shared by the workers
            torch.set_num_threads(default_torch_threads(num_workers))
        self.tokenizer = load_tokenizer(model_dir)
        self.device = device
        self.broadcast = None       # WeightBroadcast, when rollout.weight_sync=broadcast
        self.backend = make_backend(backend or rollout_cfg.backend, model_dir, rollout_cfg, device=device,
                                    dtype=resolve_dtype(dtype, device),
                                    max_model_len=rollout_cfg.max_prompt_tokens + rollout_cfg.max_response_tokens,
                                    seed=seed)
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
        if getattr(rollout_cfg, "agent", None):       # an outside agent through the gateway (docs/agents.md)
            from agentrl.gateway.engine import AgentEngine

            self.engine = AgentEngine(self.backend, self.tokenizer, self.client, rollout_cfg, env_cfg,
                                      agent=rollout_cfg.agent, instance_ids=instance_ids,
                                      stop_strings=stop_strings)
        else:
            self.engine = RolloutEngine(self.backend, self.tokenizer, self.client, rollout_cfg, env_cfg,
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

        import ray

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
    def _take_weights(self, state: Mapping[str, torch.Tensor], version: int | None) -> None:
        with self._weights_lock:
            self._staged = StagedWeights(state, version)   # a newer sync replaces one not loaded yet
            if not self._rolling_out:
                self._load_staged_locked()

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

    def load_weights(self, *buckets: PackedWeights, version: int | None = None) -> None:
        """Load one sync's packed buckets (Ray hands them over as views of the object store), waking
        a sleeping backend; ``version``: the policy version they are (recorded on every later step as
        ``policy_version``). During a rollout (called in the ``weights`` concurrency group) they are
        loaded at the next step boundary."""
        self._take_weights(unpack_weights(buckets), version)

    def load_weights_ipc(self, weights: Sequence[IpcWeights], version: int | None = None) -> None:
        """Load weights that stay on the learner's GPUs (CUDA IPC handles, one set per learner GPU): the
        backend copies them device to device, each GPU of the engine from the learner rank on it. Only
        between rollouts (trainer.mode=sync): the learner reuses the memory behind the handles after
        this call returns."""
        with self._weights_lock:
            if self._rolling_out:
                raise RuntimeError("CUDA IPC weights cannot wait for a step boundary; use rollout.weight_sync=broadcast "
                                   "with trainer.mode one_step_off or async")
            self.backend.load_weights_ipc(list(weights))
            if version is not None:
                self.engine.policy_version = int(version)

    def join_weight_broadcast(self, host: str, port: int, rank: int, world_size: int) -> None:
        """Join the weight-broadcast group as ``rank`` (the learner's rank 0 is rank 0)."""
        self.broadcast = WeightBroadcast(host, port, rank, world_size, "cuda" if self.device.startswith("cuda") else "cpu")

    def receive_weights(self, layout: BroadcastLayout, version: int | None = None) -> None:
        """Receive one broadcast of the learner's weights (straight into this worker's device) and load
        them (at the next step boundary when a rollout runs)."""
        self._take_weights(self.broadcast.receive(layout), version)

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
        import ray

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
        import ray

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
        """Load a ``{name: tensor}`` state dict or packed buckets
        (:mod:`agentrl.weights.transfer`) into every worker's backend. Each bucket goes into
        Ray's object store once and every worker maps it from there without a copy. ``version``: the
        policy version of these weights (learner updates applied), stamped on the steps generated
        with them (``StepBatch.policy_version``); None keeps the workers' current number."""
        import ray

        refs = [ray.put(bucket) for bucket in as_buckets(weights)]
        ray.get([w.load_weights.options(concurrency_group=WEIGHTS_GROUP).remote(*refs, version=version)
                 for w in self.workers])

    def load_weights_ipc(self, weights, version: int | None = None) -> None:
        """Load the learner's weights through CUDA IPC handles (one set per learner GPU; every engine GPU
        holds a learner rank)."""
        import ray

        ray.get([w.load_weights_ipc.options(concurrency_group=WEIGHTS_GROUP).remote(weights, version=version)
                 for w in self.workers])

    def join_weight_broadcast(self, host: str, port: int) -> list:
        """Start every worker joining the weight-broadcast group at ``host:port`` (ranks 1..W; the
        learner's rank 0 joins as rank 0, which completes it); the calls to wait for."""
        world = self.num_workers + 1
        return [w.join_weight_broadcast.options(concurrency_group=WEIGHTS_GROUP).remote(host, port, i + 1, world)
                for i, w in enumerate(self.workers)]

    def receive_weights(self, layout, version: int | None = None) -> list:
        """Start every worker receiving one broadcast; the calls to wait for (after rank 0 sent)."""
        return [w.receive_weights.options(concurrency_group=WEIGHTS_GROUP).remote(layout, version=version)
                for w in self.workers]

    @staticmethod
    def wait(calls: list) -> None:
        import ray

        ray.get(calls)

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
        import ray

        return [uuid for uuids in ray.get([w.gpu_uuids.remote() for w in self.workers]) for uuid in uuids]

    def sleep(self) -> float:
        """Every worker's backend frees its accelerator memory for the learner's passes (vLLM with
        ``rollout.vllm.sleep_level`` > 0; nothing otherwise) until the next :meth:`load_weights`;
        the longest worker's seconds."""
        import ray

        return max(ray.get([w.sleep.remote() for w in self.workers]), default=0.0)

    def backend_stats(self) -> list[dict[str, float]]:
        import ray

        return ray.get([w.backend_stats.remote() for w in self.workers])

    def close(self) -> None:
        import ray

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
