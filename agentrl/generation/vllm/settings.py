"""``rollout.vllm``: the vLLM back end's settings (its ``Settings``, the config section's one definition)."""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.generation.base import setting


@dataclass
class VllmConfig:
    gpu_memory_utilization: float = setting(0.6, "fraction of GPU memory vLLM may take", gt=0, max=1)
    tensor_parallel_size: int = setting(1, "GPUs per vLLM engine", min=1)
    enforce_eager: bool = setting(False, "disable CUDA graphs (always on for CPU)")
    max_num_seqs: int = setting(256, "sequences vLLM schedules at once", min=1)
    sleep_level: int = setting(0, "colocated rollout and learner (GPU): between a rollout and the next weight sync "
                               "the engine frees its GPU memory for the learner; 1 = weights to host memory and KV "
                               "cache freed, 2 = both freed (the sync reloads the weights); 0 = never (docs/rollout.md, "
                               "'Rollout and learner on one GPU')", choices=(0, 1, 2))
    model_runner: str = setting("auto", "vLLM's model runner: auto = vLLM's choice (V2 on CUDA for non-MoE models, "
                                "Qwen2 included, from 0.26), v1 or v2 (VLLM_USE_V2_MODEL_RUNNER; seeded samples differ "
                                "between them)",
                                choices=("auto", "v1", "v2"))


__all__ = ["VllmConfig"]
