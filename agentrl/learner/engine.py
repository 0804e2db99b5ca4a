"""The learner: a DeepSpeed ZeRO engine around a Hugging Face causal LM.

One :class:`Learner` per rank. ``compute_logprobs`` (:mod:`~agentrl.learner.passes`) fills
``old_logprobs`` (and ``hidden`` when the estimator asks for it, from the same forward pass) and
``ref_logprobs``; ``update`` (:mod:`~agentrl.learner.update`) runs the PPO epochs with the
estimator's loss options; the rollout weights and the Hugging Face export
(:mod:`~agentrl.learner.weight_export`) and checkpoints (:mod:`~agentrl.learner.checkpoints`) are
the other parts; the set-up is :mod:`~agentrl.learner.setup`. Several ranks are started by
:class:`agentrl.learner.group.LearnerGroup`. Design notes in docs/learner.md.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

from agentrl.config.schema import Config
from agentrl.learner import distributed
from agentrl.learner.checkpoints import LearnerCheckpoints
from agentrl.learner.passes import LearnerPasses, sampled_logprobs
from agentrl.learner.setup import (apply_lora, deepspeed_config, padding_free_works, resolve_device,
                                   warn_if_zero3_on_one_rank)
from agentrl.learner.update import LearnerUpdate, staleness_levels
from agentrl.learner.weight_export import WeightExport
from agentrl.models.loading import load_model


class Learner(LearnerPasses, LearnerUpdate, WeightExport, LearnerCheckpoints):
    """One data-parallel rank of the policy learner (rank and world size from the environment)."""

    def __init__(self, cfg: Config, model_path: str, tokenizer_path: Optional[str] = None):
        import deepspeed

        t0 = time.perf_counter()
        self.cfg = cfg
        lc = cfg.learner
        self.model_path = str(model_path)
        self.tokenizer_path = str(tokenizer_path or model_path)
        self.device = resolve_device(cfg.trainer.device)
        self.ranks = distributed.init_process_group(self.device, lc.cpu_shm_comm, lc.collective_timeout_s)
        warn_if_zero3_on_one_rank(lc.zero_stage, self.ranks.world_size)
        precision = lc.precision if lc.precision != "auto" else ("bf16" if self.device == "cuda" else "fp32")
        self.bf16 = precision == "bf16"
        self.compute_dtype = torch.bfloat16 if self.bf16 else torch.float32
        self.lora = cfg.model.lora_rank > 0

        model = load_model(self.model_path, torch.float32, cfg.model.attn_implementation, cfg.model.trust_remote_code)
        self.hf_config = model.config
        self.num_layers = int(model.config.num_hidden_layers)
        if cfg.model.gradient_checkpointing:
            model.config.use_cache = False
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.lora:
            model = apply_lora(model, cfg.model)
        self.padding_free = padding_free_works(model, lc.padding_free)

        self.ref_model = None
        if lc.kl_coef > 0 and not self.lora:  # with LoRA the reference is the base model, adapter disabled
            self.ref_model = load_model(self.model_path, self.compute_dtype, cfg.model.attn_implementation,
                                        cfg.model.trust_remote_code).eval().requires_grad_(False)
            self.ref_offloaded = self.device == "cuda" and lc.offload_ref
            self.ref_model.to("cpu" if self.ref_offloaded else self.device)

        trainable = [p for p in model.parameters() if p.requires_grad]
        ds_config = deepspeed_config(cfg, self.ranks.world_size, self.bf16)
        optimizer = None if lc.offload_optimizer else torch.optim.AdamW(trainable, lr=lc.lr,
                                                                        weight_decay=lc.weight_decay)
        warmup = lc.warmup_steps

        def schedule(opt):
            return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, model_parameters=trainable, optimizer=optimizer, lr_scheduler=schedule, config=ds_config,
            dist_init_required=False)
        # the rollout samples from softmax(logits / T) and reports those log-probs: the learner scores
        # the same distribution (verl divides the actor's and the reference's logits by T too)
        self.logit_temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
        self.update_calls = 0
        self.optimizer_steps = 0
        # CPU threads to use for the next micro-batch, asked before each one (None: leave them); the
        # trainer of an overlapped mode lends the rollout's cores to the learner while they are idle
        self.threads_now: Optional[Callable[[], int]] = None
        self._weight_senders: dict[str, Any] = {}     # a weight path's sender per path (weights_call)
        self.init_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------------------- properties
    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    @property
    def torch_device(self) -> torch.device:
        return self.engine.device

    def close(self) -> None:
        """The end of this learner: its process group goes (the engine cannot train after this)."""
        distributed.destroy_process_group()


__all__ = ["Learner", "deepspeed_config", "resolve_device", "sampled_logprobs", "staleness_levels",
           "warn_if_zero3_on_one_rank"]
