"""The learner's update: PPO epochs of mini-batches, each a sum of micro-batch gradients over the
ranks, and its metrics (a mix-in of :class:`agentrl.learner.engine.Learner`)."""

from __future__ import annotations

import math
import time
from typing import Optional

import torch

from agentrl.config.modes import training_mode
from agentrl.config.schema import Config
from agentrl.data import StepBatch
from agentrl.estimators.base import LossOptions
from agentrl.learner import distributed
from agentrl.learner.losses import ADDITIVE_METRICS, LossSettings, inputs_finite, loss_denominator, policy_loss
from agentrl.learner.passes import sampled_logprobs
from agentrl.learner.sequences import minibatch_plan, rank_micro_batches, sequence_lengths

RATE_METRICS = ("pg_clipfrac", "pg_clipfrac_lower", "approx_kl", "ratio_mean", "rollout_is_weight", "rollout_is_capped")


def staleness_levels(cfg: Config) -> int:
    """How many staleness levels a trained token can have (``TrainingMode.staleness_levels``: 1 +
    ``trainer.max_staleness`` with ``trainer.mode=async``, 2 with one_step_off; 0, none reported, with sync)."""
    return training_mode(cfg.trainer.mode).staleness_levels(cfg.trainer)



class LearnerUpdate:
    """``update`` of a :class:`~agentrl.learner.engine.Learner` (its ``engine``, ``scheduler``, ``cfg``
    and counters; the forward passes of :class:`~agentrl.learner.passes.LearnerPasses`)."""

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
            micro_rows = rank_micro_batches(minibatch, self.rank, self.world_size, lc.micro_batch_size, lengths,
                                            lc.max_tokens_per_micro_batch, self.padding_free)
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
        packed = self._pack(micro)
        # the log-probs and the entropy from the same tempered logits (learner.logprob_chunk_tokens at a time)
        logprobs, entropy = self._scores(self.engine, packed, micro.response_ids, entropy=True,
                                         entropy_grad=settings.entropy_coef > 0)
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

