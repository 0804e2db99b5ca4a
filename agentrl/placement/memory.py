"""Per-GPU memory estimates of the learner and the rollout engines, from the config alone (no GPU).

Sizes are in GB of 10^9 bytes. The parameter count P comes from the model's shape
(:func:`model_shape`: the built-in Qwen2.5 table, a local ``config.json``, the Hugging Face cache,
or ``model.tiny``); ``P_t`` is what the learner trains (P, or the LoRA adapters with
``model.lora_rank``). With N learner ranks and ``w`` bytes per weight (2 in bf16, the GPU default;
4 in fp32), one rank holds:

* weights ``w P`` (divided by N with ZeRO-3, which shards them);
* gradients ``w P_t`` (divided by N with ZeRO-2 and 3);
* AdamW: fp32 moments ``8 P_t`` plus, in bf16, the fp32 master weights ``4 P_t`` (divided by N with
  ZeRO-1 and above; none on the GPU with ``learner.offload_optimizer``);
* the reference model (``learner.kl_coef > 0`` without LoRA): a full bf16 copy ``2 P`` on every
  rank, all the time, or only during the learner pass with ``learner.offload_ref``;
* activations of one micro-batch: ``m`` records at the config's length bounds, T =
  ``max_prompt_tokens + max_response_tokens`` tokens each, R = ``max_response_tokens`` of them scored
  (m = ``learner.micro_batch_size``, or with ``learner.max_tokens_per_micro_batch`` B as many as fit:
  ``max(1, B // T)``), hidden size h, MLP size I, L layers, vocabulary V: with
  ``model.gradient_checkpointing`` ``L x mT x 2h`` bytes (each layer's bf16 input) plus one layer
  recomputed ``mT x 2(8h + 3I)``, without it ``L x mT x 2(8h + 3I)``; plus float32 logits of S positions
  ``S V x 4`` bytes three times (the logits, their softmax, its gradient). S is what
  ``learner.logprob_chunk_tokens`` C bounds: ``min(C, mR)`` in chunks (the response positions only, one
  chunk at a time forward and backward, docs/learner.md); with C = 0 ``mR`` on padding-free rows and
  ``mT`` on padded ones (the logits are kept from the shortest prompt's last token on, which in a
  micro-batch of mixed lengths is most of every row). The learner pass (no gradients) keeps one layer's
  activations and two copies of the logits;
* 1 GB for the process's CUDA context and allocator slack.

Records at the bounds make the activations a high figure; the one measured point went the other
way: 7B with LoRA on one H200 (``scripts/gpu_smoke.sh`` with the torch backend, docs/benchmarks.md)
peaked at 44.4 GB where these formulas give 41.1 GB, so leave a margin. A rollout engine's GPUs hold
what its back end declares (``GenerationBackend.memory``, agentrl.generation): vLLM reserves
``rollout.vllm.gpu_memory_utilization`` of each of its GPUs (its own budget: weights, CUDA graphs and
KV cache), which must hold at least its share of the weights plus 1 GB of KV cache, and keeps 2 GB
asleep (``rollout.vllm.sleep_level`` 1 or 2; an assumption, not measured here); the torch backend
holds the whole model on its GPU, plus an assumed 25 % for its KV cache and activations, and never
sleeps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from agentrl.config.modes import training_mode
from agentrl.generation import EngineMemory, MemoryInputs, backend_settings, planned_backend
from agentrl.models.shapes import ModelShape, known_shape, shape_of_config

GB = 1e9
CONTEXT_GB = 1.0            # a GPU process's CUDA context and allocator slack
LOGIT_COPIES_UPDATE = 3     # fp32 logits, their softmax, its gradient
LOGIT_COPIES_PASS = 2


def model_shape(cfg) -> Optional[ModelShape]:
    """The policy's shape: ``model.tiny`` for ``tiny``, the built-in Qwen2.5 table, a local
    directory's ``config.json``, or one in the Hugging Face cache (no download); None if unknown."""
    name = cfg.model.name_or_path
    if name == "tiny":
        tiny = cfg.model.tiny
        return ModelShape("tiny", tiny.hidden_size, tiny.intermediate_size, tiny.num_layers, tiny.num_heads,
                          tiny.num_kv_heads, cfg.tokenizer.vocab_size, tiny.tie_word_embeddings)
    shape = known_shape(name)
    if shape is not None:
        return shape
    config = Path(name).expanduser() / "config.json"
    if not config.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")
        except Exception:  # noqa: BLE001 - not a repository name, no hub library: no shape
            cached = None
        if not isinstance(cached, str):
            return None
        config = Path(cached)
    try:
        return shape_of_config(name, json.loads(config.read_text()))
    except (KeyError, ValueError, OSError):
        return None


def weight_bytes(cfg) -> int:
    """Bytes per weight on a GPU: ``model.dtype`` (auto = bf16 there)."""
    return 4 if cfg.model.dtype == "float32" else 2


@dataclass(frozen=True)
class LearnerMemory:
    """One learner rank's GPU memory, GB."""

    weights: float
    grads: float
    optimizer: float
    reference: float            # resident all the time (not offloaded)
    reference_pass: float       # brought to the GPU for the learner pass only (learner.offload_ref)
    activations: float          # one micro-batch of the update
    pass_activations: float     # one micro-batch of the learner pass (no gradients)
    context: float = CONTEXT_GB

    @property
    def resident(self) -> float:
        """Between the learner's passes (while a rollout runs)."""
        return self.weights + self.grads + self.optimizer + self.reference + self.context

    @property
    def update(self) -> float:
        return self.resident + self.activations

    @property
    def learner_pass(self) -> float:
        return self.resident + self.reference_pass + self.pass_activations

    @property
    def peak(self) -> float:
        return max(self.update, self.learner_pass)

    def breakdown(self) -> str:
        """How :attr:`peak` adds up: what stays on the GPU, then each pass on top of it."""
        parts = [("weights", self.weights), ("grads", self.grads), ("AdamW", self.optimizer),
                 ("ref", self.reference), ("CUDA", self.context)]
        resident = " + ".join(f"{name} {value:.1f}" for name, value in parts if value > 0.05)
        pass_text = (f"ref {self.reference_pass:.1f} + activations {self.pass_activations:.1f}" if self.reference_pass
                     else f"activations {self.pass_activations:.1f}")
        return (f"{resident} = {self.resident:.1f} resident; update + activations {self.activations:.1f} = "
                f"{self.update:.1f}; learner pass + {pass_text} = {self.learner_pass:.1f}")


def logit_positions(lc, rows: int, row_tokens: int, response_tokens: int) -> int:
    """How many positions' float32 logits one micro-batch of ``rows`` records holds at once (S above)."""
    if lc.logprob_chunk_tokens > 0:
        return min(lc.logprob_chunk_tokens, rows * response_tokens)
    return rows * (response_tokens if lc.padding_free else row_tokens)


def learner_memory(cfg, shape: ModelShape) -> LearnerMemory:
    lc, model, rollout = cfg.learner, cfg.model, cfg.rollout
    ranks = lc.num_ranks
    params = shape.parameters()
    trained = shape.lora_parameters(model.lora_rank) if model.lora_rank > 0 else params
    bf16 = lc.precision != "fp32"           # auto = bf16 on a GPU
    w = 2 if bf16 else 4
    weights = w * params / (ranks if lc.zero_stage >= 3 else 1)
    grads = w * trained / (ranks if lc.zero_stage >= 2 else 1)
    optimizer = 0.0 if lc.offload_optimizer else (12 if bf16 else 8) * trained / (ranks if lc.zero_stage >= 1 else 1)
    has_reference = lc.kl_coef > 0 and model.lora_rank == 0
    reference = 2 * params if has_reference else 0
    h, inner, layers = shape.hidden_size, shape.intermediate_size, shape.num_layers
    row = rollout.max_prompt_tokens + rollout.max_response_tokens
    m = max(1, lc.max_tokens_per_micro_batch // row) if lc.max_tokens_per_micro_batch else lc.micro_batch_size
    tokens = m * row
    one_layer = tokens * 2 * (8 * h + 3 * inner)
    logits = logit_positions(lc, m, row, rollout.max_response_tokens) * shape.vocab_size * 4
    stored = layers * tokens * 2 * h + one_layer if model.gradient_checkpointing else layers * one_layer
    return LearnerMemory(weights=weights / GB, grads=grads / GB, optimizer=optimizer / GB,
                         reference=0.0 if lc.offload_ref else reference / GB,
                         reference_pass=reference / GB if lc.offload_ref else 0.0,
                         activations=(stored + LOGIT_COPIES_UPDATE * logits) / GB,
                         pass_activations=(one_layer + LOGIT_COPIES_PASS * logits) / GB)


def memory_inputs(cfg, shape: ModelShape, gpu_memory_gb: float) -> MemoryInputs:
    """What a back end's memory estimate starts from (agentrl.generation.MemoryInputs)."""
    return MemoryInputs(shape=shape, bytes_per_weight=weight_bytes(cfg), gpu_memory_gb=gpu_memory_gb,
                        max_model_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens)


def rollout_memory(cfg, shape: ModelShape, gpu_memory_gb: float) -> EngineMemory:
    """One GPU of a rollout engine, as the configured back end declares it (on a GPU: ``auto`` as there)."""
    backend = planned_backend(cfg.rollout)
    return backend.memory(backend_settings(cfg.rollout, backend), memory_inputs(cfg, shape, gpu_memory_gb))


@dataclass(frozen=True)
class SharedGpuMemory:
    """A GPU that holds a learner rank and one GPU of an engine (colocated), GB per phase."""

    rollout_phase: float        # the engine awake, the learner resident
    learner_phase: float        # the learner's peak, the engine asleep (or awake, when it never sleeps)
    overlapped: bool            # trainer.mode one_step_off / async: both phases at once

    @property
    def peak(self) -> float:
        return self.rollout_phase + self.learner_phase if self.overlapped else max(self.rollout_phase,
                                                                                   self.learner_phase)


def shared_gpu_memory(cfg, learner: LearnerMemory, rollout: EngineMemory) -> SharedGpuMemory:
    if training_mode(cfg.trainer.mode).overlapped:      # the learner's own peak plus the awake engine
        return SharedGpuMemory(rollout_phase=rollout.budget, learner_phase=learner.peak, overlapped=True)
    return SharedGpuMemory(rollout_phase=learner.resident + rollout.budget,
                           learner_phase=learner.peak + rollout.asleep, overlapped=False)


__all__ = ["GB", "LearnerMemory", "SharedGpuMemory", "learner_memory", "logit_positions", "memory_inputs", "model_shape",
           "rollout_memory", "shared_gpu_memory", "weight_bytes"]
