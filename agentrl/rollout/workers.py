"""One rollout worker (:class:`RolloutWorker`, a Ray actor of :class:`~agentrl.rollout.worker_group.RolloutWorkerGroup`):
a generation back end, its rollout engine (:mod:`agentrl.rollout.engines`) and a share of the env
instances. Its parts: the weights it loads (:mod:`agentrl.rollout.weight_staging`, fed by a weight
path's receiver, :mod:`agentrl.weights`) and its side of the group stream
(:mod:`agentrl.rollout.group_serving`); the actor's methods are what Ray calls.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import ray
import torch

from agentrl.envs.base import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.envs.server.auth import load_token_file
from agentrl.envs.server.servers import connect_env_servers
from agentrl.generation import SamplingParams, make_backend
from agentrl.models import load_tokenizer, resolve_dtype
from agentrl.rollout.engine import RolloutResult
from agentrl.rollout.engines import build_engine
from agentrl.rollout.group_serving import GroupServing
from agentrl.rollout.weight_staging import WeightStaging
from agentrl.runtime.denormals import denormals_flushed, flush_denormals
from agentrl.weights import device_uuid

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
        flush_denormals()    # before torch starts this process's threads
        if torch_threads:
            torch.set_num_threads(int(torch_threads))
        elif torch_threads == 0:    # rollout.torch_threads=0: this machine's cores, shared by the workers
            torch.set_num_threads(default_torch_threads(num_workers))
        self.tokenizer = load_tokenizer(model_dir)
        self.device = device
        self._weight_receivers: dict[str, Any] = {}    # a weight path's receiver per path (weights_call)
        self.backend = make_backend(backend or rollout_cfg.backend, model_dir, rollout_cfg, device=device,
                                    dtype=resolve_dtype(dtype, device),
                                    max_model_len=rollout_cfg.max_prompt_tokens + rollout_cfg.max_response_tokens,
                                    seed=seed)
        # the estimator's RowInputs.hidden_layer: the prefill records each prompt's hidden state (a
        # backend that cannot, vLLM, leaves it to the learner's pass)
        if hidden_layer is not None:
            self.backend.record_hidden(hidden_layer)
        if isinstance(env_source, str):
            load_token_file(env_cfg.server_token_file)   # read on this worker's node, kept from its children
            self.client = connect_env_servers(env_source, env_cfg.step_timeout_s, spare_instance_ids)
            self.env_text = (self.client.describe() if hasattr(self.client, "describe")
                             else f"the env server at {env_source}")
        else:
            self.client = EnvClient.ray_actors(list(env_source), timeout=env_cfg.step_timeout_s)
            self.env_text = f"{len(env_source)} Ray env pool actor(s) of {env_cfg.name}"
        # agentrl's own loop, or an outside agent through the gateway (rollout.agent, docs/agents.md)
        self.engine = build_engine(self.backend, self.tokenizer, self.client, rollout_cfg, env_cfg,
                                   instance_ids=instance_ids, stop_strings=stop_strings)
        # weights that arrive while a rollout runs wait for the engine's step boundary (or a token boundary)
        self.staging = WeightStaging(self.backend, self.engine,
                                     between_tokens=getattr(rollout_cfg, "weights_between_tokens", False))
        self.serving = GroupServing(self.engine, self.staging, self._env_server_stats)
        self._last_finished: float | None = None

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        """Whether a rollout call runs, the policy version loaded, one waiting for a step boundary
        (None if none), and what the engine is doing (``doing``, for ``for_s`` seconds), where;
        answered during a rollout when called in the ``weights`` group."""
        import os

        activity = self.engine.activity
        doing = f"{activity.doing} on {self.env_text}" if activity.env else activity.doing
        rolling_out, staged = self.staging.status()
        return {"rolling_out": rolling_out, "policy_version": self.engine.policy_version,
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
        try:
            with self.staging.rolling_out():
                result = self.engine.run(tasks, group_size, sampling=sampling.with_seed(seed), seed=seed,
                                         group_ids=group_ids, traj_id_start=traj_id_start,
                                         expert_guidance=expert_guidance)
        finally:
            self.engine.mark("idle")
        result.stats["idle_before_s"] = started - self._last_finished if self._last_finished is not None else 0.0
        result.stats.update(self._env_server_stats())
        self._last_finished = time.perf_counter()
        return result

    def _env_server_stats(self) -> dict[str, float]:
        """Each env server's failures and moved instances since the last call (several servers only)."""
        stats = getattr(self.client, "server_stats", None)
        return stats() if stats is not None else {}

    # ----- weights (agentrl.weights: a path's receiver calls these) -------------------------------
    def take_weights(self, state: Mapping[str, torch.Tensor], version: int | None) -> None:
        """Load ``state`` into the back end now, or, while a rollout runs, at the next step boundary
        (between two tokens with ``rollout.weights_between_tokens``); ``version``: the policy version they
        are (recorded on every later step as ``policy_version``; None keeps the current number)."""
        self.staging.take(state, version)

    def load_between_rollouts(self, load: Callable[[], None], version: int | None, why: str) -> None:
        """Run ``load`` now (a load that cannot wait for a step boundary: CUDA IPC handles the learner
        reuses once the push returns); refused while a rollout runs, with ``why``."""
        self.staging.load_between_rollouts(load, version, why)

    def weights_call(self, receiver: type, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` of this worker's receiver of a weight path (:mod:`agentrl.weights`; ``receiver``:
        the path's ``Receiver`` class, built over this worker once and kept: it may hold a process group)."""
        key = f"{receiver.__module__}:{receiver.__qualname__}"
        if key not in self._weight_receivers:
            self._weight_receivers[key] = receiver(self)
        return getattr(self._weight_receivers[key], method)(*args, **kwargs)

    # ----- the group stream (trainer.mode=async; agentrl.rollout.group_serving) ---------------------
    def serve_groups(self, sampling: SamplingParams, group_size: int, seed: int, expert_guidance: bool = False,
                     failure_block: int = 0, session: int = 1) -> list:
        """Play the groups :meth:`add_groups` gives until :meth:`stop_serving` (:meth:`GroupServing.serve`)."""
        return self.serving.serve(sampling, group_size, seed, expert_guidance, failure_block, session)

    def add_groups(self, specs: list, session: int = 1) -> None:
        self.serving.add(specs, session)

    def take_groups(self, wait_s: float, session: int = 1) -> list[RolloutResult]:
        return self.serving.take(wait_s, session)

    def stop_serving(self, session: int = 1) -> None:
        self.serving.stop(session)

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


__all__ = ["RolloutWorker", "available_cores", "default_torch_threads", "split_evenly"]
