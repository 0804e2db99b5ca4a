"""The learner's weights as the rollout and the outside see them: Hugging Face names with LoRA merged,
gathered one at a time under ZeRO-3, the senders of the weight paths (agentrl.weights) and the Hugging
Face export (a mix-in of :class:`agentrl.learner.engine.Learner`)."""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from agentrl.learner import distributed
from agentrl.models.loading import load_tokenizer
from agentrl.weights import device_uuid


class WeightExport:
    """The weight side of a :class:`~agentrl.learner.engine.Learner` (its ``engine``, ``ranks``, ``lora``,
    ``hf_config`` and ``tokenizer_path``)."""

    def _gather(self, params):
        if self.cfg.learner.zero_stage == 3:
            import deepspeed
            return deepspeed.zero.GatheredParameters(list(params), modifier_rank=None)
        return nullcontext()

    def rollout_weights(self, every_rank: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the full weights with Hugging Face names (LoRA merged), one at a
        time, on this learner's device; yields on rank 0 only (``every_rank``: on every rank).

        Collective under ZeRO-3 (every rank must run it to the end): parameters are gathered one
        at a time. A yielded tensor may be the parameter itself, valid only until the next one is
        asked for: copy it first.
        """
        module = self.engine.module
        base = module.get_base_model() if self.lora else module
        lora_owners = {}
        if self.lora:
            from peft.tuners.lora import LoraLayer
            lora_owners = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
        for name, param in base.named_parameters(remove_duplicate=False):
            if ".lora_" in name:
                continue
            owner_name = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
            owner = lora_owners.get(owner_name) if owner_name and name.endswith(".weight") else None
            params = [param] + (list(owner.parameters()) if owner is not None else [])
            with self._gather(params):
                if self.ranks.is_main or every_rank:
                    value = param.detach()
                    if owner is not None:
                        value = value + owner.get_delta_weight("default").to(value.dtype)
                    yield name.replace(".base_layer.", "."), value

    def state_dict_for_rollout(self) -> dict[str, torch.Tensor]:
        """:meth:`rollout_weights` as a CPU ``{name: tensor}`` dict on rank 0; ``{}`` on other ranks."""
        return {name: value.to("cpu", copy=True) for name, value in self.rollout_weights()}

    def gpu_uuid(self) -> Optional[str]:
        """This rank's GPU (None on CPU)."""
        return device_uuid() if self.device == "cuda" else None

    def free_cached_memory(self) -> None:
        """Hand the CUDA memory the allocator keeps cached back to the device (before a vLLM engine on
        this GPU wakes); nothing on CPU."""
        if self.device == "cuda":
            torch.cuda.empty_cache()

    @property
    def is_main(self) -> bool:
        """Rank 0 (the one that sends what a weight path sends once)."""
        return self.ranks.is_main

    @property
    def zero_stage(self) -> int:
        return self.cfg.learner.zero_stage

    def weights_call(self, sender: type, method: str, *args: Any) -> Any:
        """``method`` of this rank's sender of a weight path (:mod:`agentrl.weights`; ``sender``: the
        path's ``Sender`` class, built over this learner once and kept: it may hold a process group)."""
        key = f"{sender.__module__}:{sender.__qualname__}"
        if key not in self._weight_senders:
            self._weight_senders[key] = sender(self)
        return getattr(self._weight_senders[key], method)(*args)

    def export_hf(self, directory: str) -> Optional[Path]:
        """Write a Hugging Face model directory (config, weights, tokenizer) on rank 0, atomically."""
        from transformers import AutoModelForCausalLM

        state = self.state_dict_for_rollout()
        target = Path(directory)
        if self.ranks.is_main:
            config = self.hf_config.__class__.from_dict(self.hf_config.to_dict())
            config.use_cache = True
            # an empty (meta) model that takes the weights as they are: no random initialisation first,
            # which for a 7B model is minutes of CPU time; the tied head is tied again after
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
            model.load_state_dict(state, strict=True, assign=True)
            model.tie_weights()
            tmp = target.with_name(target.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(str(tmp))
            load_tokenizer(self.tokenizer_path).save_pretrained(str(tmp))
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        distributed.barrier()
        return target if self.ranks.is_main else None

