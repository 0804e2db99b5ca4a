"""``agentrl bench learner``: one iteration's learner work at each ``learner.precision``.

The workload is an iteration's batch of step records at a tiny recipe's shapes: its model (random
weights; layers, width and heads from ``model.tiny``, vocabulary ``tokenizer.vocab_size``; or a
trained model directory given by ``--model``, whose weights can run at other speeds) and its
learner settings (micro- and mini-batch sizes, PPO epochs, ``kl_coef``: a reference pass when it is
> 0). The rows are synthetic tokens of the given lengths: the learner's cost depends on how many
rows and tokens there are, much less on which. The defaults are one iteration of the ALFWorld tiny
recipe as measured in docs/benchmarks.md ("Learner"): 1,331 rows of ~265 prompt and ~9 response
tokens, every row trained (no expert guidance, so no row has advantage 0).

For each precision the real :class:`~agentrl.learner.engine.Learner` (DeepSpeed, one rank) is built,
warmed up on 64 rows, then timed on the whole batch:

* ``learner_pass_s``: :meth:`Learner.compute_logprobs` (old log-probs, and the reference's);
* ``update_s``: :meth:`Learner.update` (``ppo_epochs`` passes of mini-batches, forward and backward);
* ``tokens_per_s``: trained tokens (prompt + response) per second of the update.

Also reported for every precision after the first: how far its old log-probs of the warm-up rows
are from the first precision's (same weights before any update), mean and max absolute difference
over the response tokens, which is what the precision costs in accuracy.
"""

from __future__ import annotations

import os
import tempfile
import time

from agentrl.bench._common import cpu_name, run_report

HELP = "learner time of one iteration (learner pass + PPO update) at each learner.precision"
WARMUP_ROWS = 64


def add_arguments(parser) -> None:
    parser.add_argument("--recipe", default="alfworld_gigpo_tiny",
                        help="tiny recipe whose model and learner settings are measured (default alfworld_gigpo_tiny)")
    parser.add_argument("--precisions", default="fp32,bf16",
                        help="learner.precision values to measure, comma-separated (default fp32,bf16)")
    parser.add_argument("--rows", type=int, default=1331, help="step records in the batch (default 1331)")
    parser.add_argument("--prompt-tokens", type=int, default=265,
                        help="mean prompt length; lengths are drawn from +-25%% of it (default 265)")
    parser.add_argument("--response-tokens", type=int, default=9,
                        help="mean response length; lengths are drawn from +-50%% of it (default 9)")
    parser.add_argument("--model", default=None,
                        help="a Hugging Face model directory (e.g. a run's sft_model) to time instead of random "
                             "weights of the recipe's tiny shape; its vocabulary bounds the synthetic tokens")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)


class _Vocabulary:
    """What :func:`~agentrl.models.architectures.tiny_config` reads from a tokenizer: a size and
    the special ids (the benchmark's tokens are synthetic, so no tokenizer is trained)."""

    def __init__(self, size: int):
        self.size = size
        self.eos_token_id, self.pad_token_id = size - 1, size - 2

    def __len__(self) -> int:
        return self.size

    def convert_tokens_to_ids(self, _token: str) -> int:
        return self.size - 3


def _bf16_kernels() -> bool:
    """Whether torch's oneDNN has native bf16 kernels on this CPU (False where the probe is missing)."""
    import torch

    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(torch.backends.mkldnn.is_available() and probe is not None and probe())


def make_batch(rows: int, prompt_tokens: int, response_tokens: int, vocab_size: int, seed: int):
    """``rows`` synthetic step records (8 per trajectory, 8 trajectories per group) with advantages."""
    import torch

    from agentrl.data import StepBatch

    if rows < 1 or prompt_tokens < 1 or response_tokens < 1:
        raise ValueError("--rows, --prompt-tokens and --response-tokens must be >= 1")
    gen = torch.Generator().manual_seed(seed)

    def lengths(mean: int, spread: float) -> list[int]:
        low, high = max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread)))
        return torch.randint(low, high + 1, (rows,), generator=gen).tolist()

    records = []
    for i, (p, r) in enumerate(zip(lengths(prompt_tokens, 0.25), lengths(response_tokens, 0.5))):
        records.append({
            "group_id": i // 64, "traj_id": i // 8, "step": i % 8, "reward": 0.0, "done": i % 8 == 7,
            "success": False, "anchor_obs": "",
            "prompt_ids": torch.randint(0, vocab_size - 3, (p,), generator=gen).tolist(),
            "response_ids": torch.randint(0, vocab_size - 3, (r,), generator=gen).tolist(),
            "advantages": float(torch.randn((), generator=gen)),
        })
    return StepBatch.from_records(records, pad_id=vocab_size - 2)


def _measure(args) -> dict:
    import torch

    from agentrl.config.loading import load_config
    from agentrl.learner.engine import Learner
    from agentrl.models.architectures import build_tiny_model
    from agentrl.models.loading import load_model

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    cfg = load_config(args.recipe)
    if cfg.model.name_or_path != "tiny":
        raise ValueError(f"agentrl bench learner measures tiny recipes; {args.recipe} uses {cfg.model.name_or_path}")
    results: dict[str, dict[str, float]] = {}
    first_logprobs = None
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-learner-") as scratch:
        if args.model:
            model = load_model(args.model, torch.float32)
            model_dir, vocab_size = args.model, int(model.config.vocab_size)
        else:
            model_dir, vocab_size = scratch, cfg.tokenizer.vocab_size
            model = build_tiny_model(cfg.model.tiny, _Vocabulary(vocab_size), seed=args.seed)
            model.save_pretrained(model_dir)
        params, shape = sum(p.numel() for p in model.parameters()), model.config
        del model
        batch = make_batch(args.rows, args.prompt_tokens, args.response_tokens, vocab_size, args.seed)
        warmup = batch.select(torch.arange(min(WARMUP_ROWS, len(batch))))
        for precision in precisions:
            learner = Learner(load_config(args.recipe, [f"learner.precision={precision}"]), model_dir)
            scored = learner.compute_logprobs(warmup)
            learner.update(scored)
            row: dict[str, float] = {}
            if first_logprobs is None:
                first_logprobs = scored.old_logprobs
            else:
                mask = scored.response_mask > 0
                gap = (scored.old_logprobs - first_logprobs).abs()[mask]
                row.update(logprob_gap_mean=float(gap.mean()), logprob_gap_max=float(gap.max()))
            start = time.perf_counter()
            scored = learner.compute_logprobs(batch)
            row["learner_pass_s"] = time.perf_counter() - start
            metrics = learner.update(scored)
            row.update(update_s=metrics["update_s"], tokens_per_s=metrics["tokens_per_s"],
                       optimizer_steps=metrics["optimizer_steps"])
            row["total_s"] = row["learner_pass_s"] + row["update_s"]
            results[precision] = row
            del learner
    base = results[precisions[0]]["total_s"] if precisions else None
    for row in results.values():
        row["speedup"] = base / row["total_s"] if base else 1.0
    lc = cfg.learner
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkldnn_bf16": _bf16_kernels(),
            "recipe": args.recipe, "rows": len(batch),
            "tokens": int(batch.prompt_lengths.sum() + batch.response_mask.sum()),
            "mini_batch_size": lc.mini_batch_size, "micro_batch_size": lc.micro_batch_size, "ppo_epochs": lc.ppo_epochs,
            "kl_coef": lc.kl_coef,
            "weights": args.model or "random",
            "model": f"qwen2 hidden {shape.hidden_size}, {shape.num_hidden_layers} layers, {params} params, "
                     f"vocab {shape.vocab_size}"}
    return {"meta": meta, "results": results}


def run(args) -> int:
    return run_report(args, _measure, _show)


def _show(meta: dict, rows: dict) -> None:
    print(f"learner benchmark ({meta['recipe']}): {meta['model']}, {meta['weights']} weights; {meta['rows']} rows, "
          f"{meta['tokens']} tokens, mini-batch {meta['mini_batch_size']}, micro-batch {meta['micro_batch_size']}, "
          f"{meta['ppo_epochs']} epoch(s), "
          f"kl_coef {meta['kl_coef']}; {meta['cpu']} ({meta['cpu_capability']}, bf16 kernels: {meta['mkldnn_bf16']}), "
          f"{meta['cores']} cores, {meta['torch_threads']} torch threads")
    print(f"{'precision':<11}{'pass s':>8}{'update s':>10}{'total s':>9}{'tokens/s':>10}{'speed-up':>10}"
          f"{'logprob gap mean / max':>26}")
    for name, row in rows.items():
        gap = (f"{row['logprob_gap_mean']:.2e} / {row['logprob_gap_max']:.2e}" if "logprob_gap_mean" in row else "-")
        print(f"{name:<11}{row['learner_pass_s']:>8.2f}{row['update_s']:>10.2f}{row['total_s']:>9.2f}"
              f"{row['tokens_per_s']:>10.0f}{row['speedup']:>9.2f}x{gap:>26}")
