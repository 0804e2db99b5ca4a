"""The learner: a DeepSpeed ZeRO engine around a Hugging Face causal LM.

One :class:`Learner` per rank. ``compute_logprobs`` fills ``old_logprobs`` (and ``hidden`` when
the estimator asks for it, from the same forward pass) and ``ref_logprobs``; ``update`` runs the
PPO epochs with the estimator's loss options;
checkpoints, the rollout weights and the Hugging Face export live here too. Several ranks are
started by :class:`agentrl.learner.group.LearnerGroup`. Design notes in docs/learner.md.
"""

from __future__ import annotations

import math
import random
import shutil
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from agentrl.config.schema import Config
from agentrl.config.modes import training_mode
from agentrl.data import StepBatch
from agentrl.estimators.base import LossOptions
from agentrl.learner import distributed
from agentrl.learner.losses import (ADDITIVE_METRICS, LossSettings, entropy_from_logits, inputs_finite,
                                    loss_denominator, policy_loss)
from agentrl.models.hidden_states import LastPromptCapture, check_hidden_index
from agentrl.learner.sequences import (PackedSequences, by_length, gather_response, minibatch_plan, pack,
                                       pack_batch, rank_micro_batches, response_positions, sequence_lengths)
from agentrl.models.loading import load_model, load_tokenizer
from agentrl.weights import device_uuid

CHECKPOINT_TAG = "state"
RATE_METRICS = ("pg_clipfrac", "pg_clipfrac_lower", "approx_kl", "ratio_mean", "rollout_is_weight", "rollout_is_capped")


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


def _apply_lora(model, model_cfg):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise RuntimeError("model.lora_rank > 0 needs peft: pip install 'agentrl[lora]'") from err
    if model_cfg.gradient_checkpointing:
        model.enable_input_require_grads()
    lora = LoraConfig(r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha, lora_dropout=0.0,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def sampled_logprobs(batch: StepBatch) -> torch.Tensor:
    """The rollout backend's log-probs of the response tokens, with the expert's (guided) rows given
    their ``old_logprobs``: nothing sampled those, so their importance weight is 1."""
    guided = batch.is_expert.unsqueeze(1)
    return torch.where(guided, batch.old_logprobs.float(), batch.rollout_logprobs.float())


def staleness_levels(cfg: Config) -> int:
    """How many staleness levels a trained token can have (``TrainingMode.staleness_levels``: 1 +
    ``trainer.max_staleness`` with ``trainer.mode=async``, 2 with one_step_off; 0, none reported, with sync)."""
    return training_mode(cfg.trainer.mode).staleness_levels(cfg.trainer)


def warn_if_zero3_on_one_rank(zero_stage: int, world_size: int) -> None:
    """ZeRO-3 on one rank has nothing to partition, yet gathers and releases every parameter for
    each micro-batch: measured 4.5x ZeRO-2's update time at the 7B shape on one H200, at the same
    peak memory (docs/benchmarks.md, "ZeRO-2 against ZeRO-3 at 7B")."""
    if zero_stage == 3 and world_size == 1:
        warnings.warn("learner.zero_stage=3 with one learner rank partitions nothing and gathers every parameter "
                      "for each micro-batch (4.5x ZeRO-2's update time at 7B on one GPU, same memory); set "
                      "learner.zero_stage=2, or use ZeRO-3 with learner.num_ranks >= 2", RuntimeWarning, stacklevel=3)


class Learner:
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
            model = _apply_lora(model, cfg.model)

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

    # ---------------------------------------------------------------------------------- forward
    def _forward(self, model, packed: PackedSequences):
        packed = packed.to(self.torch_device)
        return model(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                     position_ids=packed.position_ids, logits_to_keep=packed.logits_to_keep, use_cache=False)

    def _scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """Float32 logits divided by the rollout's sampling temperature (``rollout.temperature``)."""
        logits = logits.float()
        return logits if self.logit_temperature == 1.0 else logits / self.logit_temperature

    def _response_logprobs(self, logits: torch.Tensor, packed: PackedSequences, response_ids: torch.Tensor
                           ) -> torch.Tensor:
        """Log-probs [n, R] of the response tokens from kept logits [n, K, V] already divided by the
        sampling temperature (:meth:`_scaled`); 0 past each response."""
        packed = packed.to(logits.device)
        pos, valid = response_positions(packed)
        logsumexp = torch.logsumexp(logits, dim=-1).gather(1, pos)
        rows = torch.arange(logits.shape[0], device=logits.device).unsqueeze(1)
        token_logits = logits[rows, pos, response_ids.to(logits.device)]
        return torch.where(valid, token_logits - logsumexp, torch.zeros_like(logsumexp))

    def _set_threads(self) -> None:
        if self.threads_now is not None:
            threads = self.threads_now()
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)

    def _dummy_packed(self) -> PackedSequences:
        one = torch.zeros(1, 1, dtype=torch.int64)
        return pack(one, torch.ones(1, dtype=torch.int64), one, torch.zeros(1, 1), 0)

    def _micro_batches(self, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Row chunks of at most micro_batch_size, rows of similar ``lengths`` together (less
        padding); as many on every rank (empty ones pad)."""
        size = self.cfg.learner.micro_batch_size
        rows = len(lengths)
        local = list(by_length(torch.arange(rows), lengths).split(size)) if rows else []
        count = int(distributed.all_reduce_values([len(local)], "max")[0])
        return local + [torch.zeros(0, dtype=torch.int64)] * (count - len(local))

    @torch.no_grad()
    def compute_logprobs(self, batch: StepBatch, hidden_layer: Optional[int] = None) -> StepBatch:
        """Fill ``old_logprobs``, ``ref_logprobs`` (when ``kl_coef > 0``) and, with a
        ``hidden_layer`` (the estimator's ``RowInputs.hidden_layer``), ``hidden``.

        One forward pass of the actor per micro-batch yields both the response log-probs and the
        hidden state at the last prompt token of that layer. With ``learner.recompute_logprobs=false``
        the sampled rows' old log-probs are the rollout backend's and the actor's pass runs only over
        the expert-guided rows (nothing sampled their tokens) unless hidden states are asked for. With
        several ranks each rank is given its own rows (see LearnerGroup); every rank runs as many
        forward passes.
        """
        with_hidden = hidden_layer is not None
        layer = check_hidden_index(int(hidden_layer), self.num_layers) if with_hidden else None
        recompute = self.cfg.learner.recompute_logprobs
        everything = torch.arange(len(batch))
        actor_rows = everything if recompute or with_hidden else torch.nonzero(batch.is_expert).flatten()
        self.engine.eval()
        columns: dict[str, Any] = {}
        old, hidden = self._logprob_pass(batch, actor_rows, self.engine, layer)
        # without recompute only the expert rows' values came from the actor; the rest are the rollout's
        columns["old_logprobs"] = old if recompute else sampled_logprobs(batch.with_columns(old_logprobs=old))
        if with_hidden:
            columns["hidden"] = hidden
        if self.cfg.learner.kl_coef > 0:
            if self.ref_model is not None and self.ref_offloaded:
                self.ref_model.to(self.torch_device)
            try:
                columns["ref_logprobs"], _ = self._logprob_pass(batch, everything, None, None)
            finally:
                if self.ref_model is not None and self.ref_offloaded:
                    self.ref_model.to("cpu")
        return batch.with_columns(**columns)

    def _logprob_pass(self, batch: StepBatch, rows: torch.Tensor, model, layer: Optional[int]
                      ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Response log-probs [len(batch), R] of ``model`` (None = the reference) on ``rows`` (0 on the
        others) and, with a ``layer``, hidden states [len(batch), H] at the last prompt tokens."""
        logprobs = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
        hidden = torch.zeros(len(batch), self.hf_config.hidden_size) if layer is not None else None
        forward = self._reference_forward if model is None else (lambda packed: self._forward(model, packed).logits)
        for chunk in self._micro_batches(sequence_lengths(batch)[rows]):
            self._set_threads()
            if len(chunk) == 0:         # another rank has more micro-batches: a collective per forward
                forward(self._dummy_packed())
                continue
            chunk = rows[chunk]
            micro = batch.select(chunk)
            packed = pack_batch(micro)
            if layer is not None:       # a hook keeps [rows, hidden] at the last prompt tokens, not every layer
                with LastPromptCapture(self.engine.module, layer, self.num_layers,
                                       packed.prompt_lengths - 1) as capture:
                    logits = forward(packed)
                hidden[chunk] = capture.states.float().cpu()
            else:
                logits = forward(packed)
            logprobs[chunk] = self._response_logprobs(self._scaled(logits), packed, micro.response_ids).cpu()
            del logits
        return logprobs, hidden

    def _reference_forward(self, packed: PackedSequences) -> torch.Tensor:
        if self.lora:
            with self.engine.module.disable_adapter():
                return self._forward(self.engine, packed).logits
        return self._forward(self.ref_model, packed).logits

    # ----------------------------------------------------------------------------------- update
    def loss_settings(self, options: Optional[LossOptions] = None) -> LossSettings:
        """``learner.*`` and the estimator's :class:`~agentrl.estimators.LossOptions`."""
        options = options or LossOptions()
        return LossSettings.from_config(self.cfg.learner, action_level_ratio=options.action_level_ratio,
                                        rollout_runs_ahead=training_mode(self.cfg.trainer.mode).overlapped,
                                        response_budget=self.cfg.rollout.max_response_tokens)

    def update(self, batch: StepBatch, options: Optional[LossOptions] = None, version: Optional[int] = None
               ) -> dict[str, float]:
        """``ppo_epochs`` shuffled passes of mini-batches over ``batch``; mean metrics over optimizer steps.

        ``version``: this learner's policy version. When the rollout runs ahead (trainer.mode
        one_step_off, async) the clipped share and the capped share of the trained tokens are also
        reported per staleness level, ``version`` minus the version that sampled each token
        (``pg_clipfrac_staleness_<n>``, ``rollout_is_capped_staleness_<n>``, ``tokens_staleness_<n>``).

        Every rank is given the whole batch: the shuffle is the same on all ranks (seeded by
        ``trainer.seed`` and the update count) and each rank trains on its slice of every
        mini-batch. Losses are normalised by the whole mini-batch (all ranks), so the result does
        not depend on the number of ranks or the micro-batch size. A mini-batch whose advantages
        or old/reference log-probs are not finite is skipped before any forward pass.
        """
        lc = self.cfg.learner
        if batch.advantages is None or batch.old_logprobs is None:
            raise ValueError("update needs advantages (estimator) and old_logprobs (compute_logprobs)")
        if lc.kl_coef > 0 and batch.ref_logprobs is None:
            raise ValueError("learner.kl_coef > 0 needs ref_logprobs: run compute_logprobs first")
        settings = self.loss_settings(options)
        mode = settings.loss_agg_mode
        rates = RATE_METRICS + settings.loss_metrics      # the common rates and the policy loss's own
        generator = torch.Generator().manual_seed(self.cfg.trainer.seed * 1_000_003 + self.update_calls)
        plan = minibatch_plan(len(batch), lc.mini_batch_size, lc.ppo_epochs, generator)
        lengths = sequence_lengths(batch)
        self.engine.train()
        levels = staleness_levels(self.cfg) if version is not None else 0
        self._by_staleness = torch.zeros(levels, 3, dtype=torch.float64)     # tokens, clipped, capped
        self._version = version
        steps: list[dict[str, float]] = []
        skipped_steps = skipped_micro = 0
        tokens = 0
        t0 = time.perf_counter()
        for minibatch in plan:
            micro_rows = rank_micro_batches(minibatch, self.rank, self.world_size, lc.micro_batch_size, lengths)
            local = torch.cat(micro_rows)
            mask = batch.response_mask[local]
            ok = inputs_finite(mask, batch.advantages[local], batch.old_logprobs[local],
                               batch.ref_logprobs[local] if lc.kl_coef > 0 else None)
            denominator, bad = distributed.all_reduce_values([loss_denominator(mask, mode), 0.0 if ok else 1.0])
            if bad:
                skipped_steps += 1
                continue
            sums = dict.fromkeys(ADDITIVE_METRICS + rates + ("tokens",), 0.0)
            ratio_max, ratio_min = -math.inf, math.inf
            lr = self.scheduler.get_last_lr()[0]
            for k, rows in enumerate(micro_rows):
                self._set_threads()
                self.engine.set_gradient_accumulation_boundary(k == len(micro_rows) - 1)
                out, seq_tokens = self._micro_step(batch, rows, settings, denominator) if len(rows) else (None, 0)
                tokens += seq_tokens
                if out is None or not out.finite:
                    skipped_micro += int(out is not None)
                    self._dummy_backward()
                    continue
                for key in ADDITIVE_METRICS:
                    sums[key] += out.metrics.get(key, 0.0)
                for key in rates:
                    sums[key] += out.metrics[key] * out.num_tokens
                sums["tokens"] += out.num_tokens
                if out.num_tokens:
                    ratio_max, ratio_min = max(ratio_max, out.metrics["ratio_max"]), min(ratio_min, out.metrics["ratio_min"])
            self.engine.step()
            self.optimizer_steps += 1
            steps.append(self._reduce_step_metrics(sums, ratio_max, ratio_min, lr, rates))
        elapsed = time.perf_counter() - t0
        self.update_calls += 1
        metrics = {key: sum(s[key] for s in steps) / len(steps) for key in steps[0]} if steps else {}
        if batch.ref_logprobs is None:
            metrics.pop("kl_ref", None)
        total_tokens = distributed.all_reduce_values([tokens])[0]
        # optimizer_steps_total: every step since the run began, checkpointed (a resumed run continues the count)
        metrics.update(self._staleness_metrics())
        metrics.update(optimizer_steps=float(len(steps)), optimizer_steps_total=float(self.optimizer_steps),
                       skipped_steps=float(skipped_steps),
                       skipped_micro_batches=distributed.all_reduce_values([skipped_micro])[0],
                       tokens_per_s=total_tokens / elapsed if elapsed > 0 else 0.0, update_s=elapsed)
        return metrics

    def _micro_step(self, batch: StepBatch, rows: torch.Tensor, settings: LossSettings, denominator: float):
        micro = batch.select(rows)
        packed = pack_batch(micro)
        logits = self._forward(self.engine, packed).logits
        logits = self._scaled(logits)  # once: the log-probs and the entropy use the same tempered logits
        logprobs = self._response_logprobs(logits, packed, micro.response_ids)
        with nullcontext() if settings.entropy_coef > 0 else torch.no_grad():
            entropy = gather_response(entropy_from_logits(logits), packed.to(logits.device))
        device = logprobs.device
        old = micro.old_logprobs.to(device)
        out = policy_loss(logprobs, old, micro.advantages.to(device), micro.response_mask.to(device), settings,
                          ref_logprobs=micro.ref_logprobs.to(device) if micro.ref_logprobs is not None else None,
                          entropy=entropy, denominator=denominator,
                          rollout_logprobs=sampled_logprobs(micro).to(device) if settings.rollout_is_cap > 0 else None)
        if out.finite:
            # DeepSpeed averages gradients over ranks; the loss is already a share of the global mean
            self.engine.backward(out.loss * self.world_size)
            self._count_by_staleness(micro, out)
        return out, packed.num_tokens()

    def _count_by_staleness(self, micro: StepBatch, out) -> None:
        """Trained, clipped and capped tokens of ``micro`` per staleness level (expert rows left out)."""
        levels = len(self._by_staleness)
        if not levels:
            return
        trained = (micro.response_mask > 0) & ~micro.is_expert.unsqueeze(1)
        age = (self._version - micro.token_versions()).clamp(0, levels - 1)[trained]
        clipped = out.clipped.cpu()[trained].double()
        capped = out.capped.cpu()[trained].double() if out.capped is not None else torch.zeros_like(clipped)
        for column, values in enumerate((torch.ones_like(clipped), clipped, capped)):
            self._by_staleness[:, column] += torch.zeros(levels, dtype=torch.float64).index_add_(0, age, values)

    def _staleness_metrics(self) -> dict[str, float]:
        levels = len(self._by_staleness)
        if not levels:
            return {}
        totals = torch.tensor(distributed.all_reduce_values(self._by_staleness.flatten().tolist())).view(levels, 3)
        metrics = {}
        for level, (tokens, clipped, capped) in enumerate(totals.tolist()):
            metrics[f"tokens_staleness_{level}"] = tokens
            if tokens:
                metrics[f"pg_clipfrac_staleness_{level}"] = clipped / tokens
                metrics[f"rollout_is_capped_staleness_{level}"] = capped / tokens
        return metrics

    def _dummy_backward(self) -> None:
        """A zero-gradient forward/backward that keeps this rank in step with the others' collectives."""
        logits = self._forward(self.engine, self._dummy_packed()).logits
        self.engine.backward(logits.float().sum() * 0.0)

    def _reduce_step_metrics(self, sums: dict[str, float], ratio_max: float, ratio_min: float, lr: float,
                             rates: tuple[str, ...] = RATE_METRICS) -> dict[str, float]:
        keys = list(sums)
        totals = dict(zip(keys, distributed.all_reduce_values([sums[k] for k in keys])))
        rmax, neg_rmin = distributed.all_reduce_values([ratio_max, -ratio_min], "max")
        tok = totals.pop("tokens")
        step = {key: totals[key] for key in ADDITIVE_METRICS}
        step.update({key: totals[key] / tok if tok else 0.0 for key in rates})
        step.update(ratio_max=rmax if math.isfinite(rmax) else 1.0, ratio_min=-neg_rmin if math.isfinite(neg_rmin) else 1.0,
                    lr=float(lr))
        norm = self.engine.get_global_grad_norm()
        if norm is not None:
            step["grad_norm"] = float(norm)
        return step

    # ---------------------------------------------------------------------------------- weights
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

    def close(self) -> None:
        """The end of this learner: its process group goes (the engine cannot train after this)."""
        distributed.destroy_process_group()

    # ------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, directory: str) -> Path:
        """Model, optimizer, scheduler, RNG and counters; written to ``<dir>.partial`` then renamed."""
        target = Path(directory)
        tmp = target.with_name(target.name + ".partial")
        if self.ranks.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        distributed.barrier()
        client_state = {"update_calls": self.update_calls, "optimizer_steps": self.optimizer_steps}
        self.engine.save_checkpoint(str(tmp), tag=CHECKPOINT_TAG, client_state=client_state, save_latest=False)
        torch.save(_rng_state(), tmp / f"rng_rank{self.rank}.pt")
        distributed.barrier()
        if self.ranks.is_main:
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        distributed.barrier()
        return target

    def load_checkpoint(self, directory: str) -> None:
        directory = Path(directory)
        if not (directory / CHECKPOINT_TAG).is_dir():
            raise FileNotFoundError(f"{directory} is not a learner checkpoint (no {CHECKPOINT_TAG}/ inside)")
        _, client_state = self.engine.load_checkpoint(str(directory), tag=CHECKPOINT_TAG, load_optimizer_states=True,
                                                      load_lr_scheduler_states=True)
        client_state = client_state or {}
        self.update_calls = int(client_state.get("update_calls", 0))
        self.optimizer_steps = int(client_state.get("optimizer_steps", 0))
        rng_file = directory / f"rng_rank{self.rank}.pt"
        if rng_file.is_file():
            _set_rng_state(torch.load(rng_file, weights_only=False))
