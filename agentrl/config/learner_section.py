"""``learner``: the learner's own keys and one section per built-in policy loss, generated from the
losses' ``Params`` (agentrl.policy_losses); :mod:`agentrl.config.schema` places it in the config tree.
Fields are made with :func:`~agentrl.estimators.params.param` (help text and checks, as schema's ``F``).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional

from agentrl.estimators.params import param
from agentrl.policy_losses import AGG_MODES, KL_TYPES, PARAMS_SECTION, builtin_policy_losses


def _policy_loss_help() -> str:
    return (f"the policy-gradient loss: {', '.join(builtin_policy_losses())} (formulas, sources and what composes "
            "with what in docs/learner.md), or a class of one's own by import path package.module:ClassName")


def _agg_mode_help() -> str:
    by_mode = {mode: [name for name, cls in builtin_policy_losses().items() if cls.default_agg_mode == mode]
               for mode in AGG_MODES}
    own = "; ".join(f"{mode} for {', '.join(names)}" for mode, names in by_mode.items() if names)
    return ("how token losses are averaged (the policy, KL and entropy terms alike); null = the policy loss's own "
            f"({own}); seq-mean-token-sum-norm is Dr. GRPO's")


@dataclass
class LearnerGeneralSettings:
    """``learner``'s own keys; the policy losses' sections are added by :func:`_learner_config_class`."""

    num_ranks: int = param(1, "DeepSpeed data-parallel ranks (processes)", min=1)
    zero_stage: int = param(2, "DeepSpeed ZeRO stage", choices=(0, 1, 2, 3))
    precision: str = param("auto", "auto = bf16 on GPU, fp32 on CPU", choices=("auto", "fp32", "bf16"))
    offload_optimizer: bool = param(False, "ZeRO optimizer state offload to CPU")
    offload_ref: bool = param(True, "keep the reference model's weights on CPU between passes")
    cpu_shm_comm: bool = param(False, "on CPU, let DeepSpeed JIT-build its shared-memory all-reduce (about 40 s "
                           "the first time); off = plain gloo collectives")
    torch_threads: int = param(0, "CPU threads of a learner rank that runs in the trainer's process (learner.num_ranks=1, "
                           "on CPU); 0 = torch's default (every core) with trainer.mode=sync; with one_step_off or async "
                           "one share of the cores (rollout.num_workers + 1 shares) while a rollout call runs and "
                           "every core while none does", min=0)
    collective_timeout_s: float = param(300.0, "with learner.num_ranks > 1: how long a rank waits in a collective for "
                                    "the others (the process group's timeout, gloo and NCCL) and how long the "
                                    "trainer waits for a rank that has not returned after another one timed out or "
                                    "returned; then the run stops with one line naming the rank. Must exceed the "
                                    "longest time one rank legitimately runs ahead of the others: a model load that "
                                    "is slower on one node, rank 0's share of a checkpoint or export "
                                    "(docs/reliability.md)", gt=0)
    lr: float = param(1e-6, "actor learning rate", gt=0)
    weight_decay: float = param(0.0, "AdamW weight decay", min=0)
    warmup_steps: int = param(0, "linear learning-rate warmup (optimizer steps)", min=0)
    grad_clip: float = param(1.0, "gradient norm clip; 0 disables", min=0)
    ppo_epochs: int = param(1, "passes over each iteration's data", min=1)
    mini_batch_size: int = param(256, "step records per optimizer step", min=1)
    micro_batch_size: int = param(32, "step records per forward/backward on one rank", min=1)
    max_tokens_per_micro_batch: int = param(0, "cut micro-batches by tokens instead of rows: rows ordered by length "
                                            "and packed while rows x longest row (padding-free: their sum) stays "
                                            "within this many tokens, the ranks given about as many tokens each; "
                                            "0 = micro_batch_size rows (docs/learner.md)", min=0)
    logprob_chunk_tokens: int = param(1024, "response tokens whose float32 logits [tokens x vocabulary] are taken at "
                                      "once for log-probs and entropy, forward and backward (output head on the "
                                      "final hidden states of the response positions, checkpointed per chunk); 0 = "
                                      "the logits of every kept position of the micro-batch at once "
                                      "(docs/learner.md)", min=0)
    padding_free: bool = param(False, "concatenate a micro-batch's rows into one sequence, position ids restarting "
                               "per row, where the attention implementation keeps rows apart (sdpa, eager, "
                               "flex_attention, flash_attention_2/3 in transformers); otherwise padded rows, with a "
                               "one-line message (docs/learner.md)")
    clip_ratio_low: float = param(0.2, "PPO clip below 1", min=0, max=1)
    clip_ratio_high: float = param(0.2, "PPO clip above 1", min=0)
    dual_clip_c: float = param(3.0, "dual-clip bound for negative advantages; 0 disables", off_or_gt=1)
    rollout_is_cap: Optional[float] = param(None, "truncated importance sampling: weight each sampled token's "
                                        "policy-gradient term by min(pi_old / pi_rollout, cap). With trainer.mode "
                                        "one_step_off or async this is the behaviour weight of the decoupled objective "
                                        "(docs/async.md); in sync it corrects the rollout backend's numerics (e.g. 2 "
                                        "with bf16 vLLM); 0 disables; null = 2 with one_step_off/async, 0 with sync",
                                        off_or_min=1)
    recompute_logprobs: bool = param(True, "run the actor's forward pass for the old (proximal) log-probs before the "
                                 "update; false = the rollout backend's log-probs of the sampled tokens are the old "
                                 "policy (one forward pass less per trained row; right when the backend runs the "
                                 "learner's weights in the same precision, rollout_logprob_gap near 0); only with "
                                 "trainer.mode=sync (the rollout's policy is then the learner's)")
    policy_loss: str = param("vanilla", _policy_loss_help())
    loss_agg_mode: Optional[str] = param(None, _agg_mode_help(), choices=AGG_MODES)
    loss_scale_factor: int = param(0, "seq-mean-token-sum-norm divides each step's token sum by this constant; 0 = "
                               "rollout.max_response_tokens", min=0)
    kl_coef: float = param(0.01, "KL-to-reference loss coefficient; 0 disables the reference model", min=0)
    kl_type: str = param("low_var_kl", "KL estimator: k1, k2, low_var_kl (k3), k3+ (k3's value, k2's gradient), abs "
                     "(docs/learner.md)", choices=KL_TYPES)
    entropy_coef: float = param(0.001, "entropy bonus coefficient", min=0)
    skip_zero_advantage: bool = param(False, "leave step records whose advantage is exactly 0 out of the update "
                                  "(e.g. GRPO groups whose episodes all won or all failed): with kl_coef = "
                                  "entropy_coef = 0 their gradient is zero, so this saves their forward/backward; "
                                  "otherwise their KL and entropy terms are dropped with them")


def _learner_config_class() -> type:
    """``learner``: the general keys (``learner.<key>``), one section per built-in policy loss that declares
    parameters (``learner.<name>.<key>``, its ``Params``) and ``learner.policy_loss_params`` for one loaded by
    import path, generated from the losses' declarations (agentrl.policy_losses)."""
    hints = typing.get_type_hints(LearnerGeneralSettings)
    general = dataclasses.fields(LearnerGeneralSettings)
    fields: list[tuple[str, Any, Any]] = [
        (f.name, hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                   metadata=f.metadata)) for f in general]
    for name, loss in builtin_policy_losses().items():
        params = dataclasses.fields(loss.Params)
        if not params:
            continue
        if name in {f.name for f in general} | {PARAMS_SECTION.rpartition(".")[2]}:
            raise ValueError(f"the {name} policy loss's parameters would hide the key learner.{name}: rename the loss")
        param_hints = typing.get_type_hints(loss.Params)
        section = dataclasses.make_dataclass(
            f"{loss.__name__}LossSection",
            [(f.name, param_hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                              metadata=f.metadata)) for f in params],
            namespace={"__module__": __name__})
        globals()[section.__name__] = section      # importable by name: a config pickles into Ray actors
        fields.append((name, section, param(help=f"{loss.title or name} policy loss parameters (learner.policy_loss="
                                              f"{name})", factory=section)))
    fields.append((PARAMS_SECTION.rpartition(".")[2], dict,
                   param(help="the parameters of a policy loss loaded by import path (learner.policy_loss="
                          "package.module:ClassName), checked against its Params; built-in losses read "
                          "learner.<name>", factory=dict)))
    return dataclasses.make_dataclass("LearnerConfig", fields, namespace={"__module__": __name__})


LearnerConfig = _learner_config_class()
