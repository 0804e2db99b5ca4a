"""How a learner rank is set up: its device, its DeepSpeed configuration and its LoRA adapters
(used by :class:`agentrl.learner.engine.Learner`; design notes in docs/learner.md)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from agentrl.config.schema import Config


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but no CUDA device is visible")
    return name


def deepspeed_config(cfg: Config, world_size: int, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed configuration of the actor engine (see docs/learner.md)."""
    lc = cfg.learner
    zero: dict[str, Any] = {"stage": lc.zero_stage}
    if lc.zero_stage >= 2:
        zero.update(contiguous_gradients=True, overlap_comm=False)
    if lc.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    config: dict[str, Any] = {
        # the learner marks accumulation boundaries itself (set_gradient_accumulation_boundary)
        "train_micro_batch_size_per_gpu": lc.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": lc.micro_batch_size * world_size,
        "gradient_clipping": lc.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }
    if lc.offload_optimizer:
        # ZeRO-Offload needs DeepSpeed's CPU Adam (a JIT-built extension); weight decay as in AdamW
        config["optimizer"] = {"type": "AdamW", "params": {"lr": lc.lr, "weight_decay": lc.weight_decay}}
    return config


def apply_lora(model, model_cfg):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise RuntimeError("model.lora_rank > 0 needs peft: pip install 'agentrl[lora]'") from err
    if model_cfg.gradient_checkpointing:
        model.enable_input_require_grads()
    lora = LoraConfig(r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha, lora_dropout=0.0,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def warn_if_zero3_on_one_rank(zero_stage: int, world_size: int) -> None:
    """ZeRO-3 on one rank has nothing to partition, yet gathers and releases every parameter for
    each micro-batch: measured 4.5x ZeRO-2's update time at the 7B shape on one H200, at the same
    peak memory (docs/benchmarks.md, "ZeRO-2 against ZeRO-3 at 7B")."""
    if zero_stage == 3 and world_size == 1:
        warnings.warn("learner.zero_stage=3 with one learner rank partitions nothing and gathers every parameter "
                      "for each micro-batch (4.5x ZeRO-2's update time at 7B on one GPU, same memory); set "
                      "learner.zero_stage=2, or use ZeRO-3 with learner.num_ranks >= 2", RuntimeWarning, stacklevel=3)



# attention implementations of transformers that keep padding-free rows apart: the masks of sdpa, eager and
# flex_attention are built from position ids that restart (transformers.masking_utils), flash-attention
# runs its variable-length kernel on the rows they mark (docs/learner.md, "Padding-free rows")
PADDING_FREE_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")


def padding_free_works(model, asked: bool) -> bool:
    """Whether ``learner.padding_free`` (``asked``) can run on ``model``: a transformers model whose attention
    implementation is one of :data:`PADDING_FREE_ATTENTION`; when asked but not, a one-line warning and
    padded rows."""
    if not asked:
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    attention = getattr(base.config, "_attn_implementation", None)
    if type(base).__module__.startswith("transformers.models.") and attention in PADDING_FREE_ATTENTION:
        return True
    warnings.warn(f"learner.padding_free=true needs a transformers model with attention {', '.join(PADDING_FREE_ATTENTION)}; "
                  f"{type(base).__name__} runs {attention}: padded rows instead (set model.attn_implementation=sdpa, "
                  f"or learner.padding_free=false)", RuntimeWarning, stacklevel=3)
    return False
