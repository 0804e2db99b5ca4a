"""``agentrl bench learner``: one iteration's learner work at each ``learner.precision``, and with
``--variants`` the learner's memory and speed options side by side.

The workload is an iteration's batch of step records at a tiny recipe's shapes: its model (random
weights; layers, width and heads from ``model.tiny``, vocabulary ``tokenizer.vocab_size``; or a
trained model directory given by ``--model``, whose weights can run at other speeds) and its
learner settings (micro- and mini-batch sizes, PPO epochs, ``kl_coef``: a reference pass when it is
> 0). The rows are synthetic tokens of the given lengths: the learner's cost depends on how many
rows and tokens there are, much less on which. The defaults are one iteration of the ALFWorld tiny
recipe as measured in docs/benchmarks.md ("Learner"): 1,331 rows of ~265 prompt and ~9 response
tokens, every row trained (no expert guidance, so no row has advantage 0).

For each precision the real :class:`~agentrl.learner.engine.Learner` (DeepSpeed, one rank) is built,
warmed up on 64 rows (``--warmup-rows``), then timed on the whole batch:

* ``learner_pass_s``: :meth:`Learner.compute_logprobs` (old log-probs, and the reference's);
* ``update_s``: :meth:`Learner.update` (``ppo_epochs`` passes of mini-batches, forward and backward);
* ``tokens_per_s``: trained tokens (prompt + response) per second of the update.

* ``tokens_per_s_all``: real tokens (no padding) of the pass and the update per second of both;
* ``pass_peak_mb`` / ``micro_peak_mb`` / ``update_peak_mb``: the most memory the learner pass / one
  micro-batch's forward and backward in the update (the log-prob stage: activations, logits and their
  gradient) / the whole update with its optimizer steps added on top of what was resident when it
  began: on CPU the process's peak resident set (``VmHWM``, reset before the stage through
  ``/proc/self/clear_refs``), on a GPU ``torch.cuda.max_memory_allocated``.

Also reported for every row after the first: how far its old log-probs of the warm-up rows are from
the first row's (same weights before any update), mean and max absolute difference over the response
tokens, which is what the precision (or a variant) costs in accuracy.

``--variants`` names learner settings to compare (:data:`VARIANTS`): ``today`` (the logits of every
kept position at once, micro-batches of ``learner.micro_batch_size`` rows, padded), ``chunked``
(``learner.logprob_chunk_tokens``), ``token_budget`` (``learner.max_tokens_per_micro_batch``, by default
the micro-batch size times the mean row length), ``padding_free`` (``learner.padding_free``) and
``all``. ``--shape`` replaces the recipe's tiny model by a Qwen2.5 architecture: ``qwen2.5-cpu`` (the
real 151,936-token vocabulary on a decoder small enough for a CPU) or a built-in one by name (e.g.
``Qwen/Qwen2.5-7B-Instruct``, random weights); ``--prompt-range`` / ``--response-range`` draw lengths
uniformly (the ALFWorld prompts with two steps of history: 700-1800 and 10-250), ``--set`` overrides
any config key (e.g. ``learner.micro_batch_size=4``).
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import time

from agentrl.bench._common import cpu_name, run_report
from agentrl.config.loading import load_config
from agentrl.data import StepBatch
from agentrl.learner.engine import Learner
from agentrl.models.architectures import build_tiny_model, qwen25_config
from agentrl.models.loading import load_model

HELP = "learner time and memory of one iteration (learner pass + PPO update) at each learner.precision / variant"
WARMUP_ROWS = 64
# learner settings each --variants name stands for ("{budget}": --max-tokens, "{chunk}": --chunk-tokens)
VARIANTS = {
    "today": ["learner.logprob_chunk_tokens=0"],
    "chunked": ["learner.logprob_chunk_tokens={chunk}"],
    "token_budget": ["learner.logprob_chunk_tokens=0", "learner.max_tokens_per_micro_batch={budget}"],
    "padding_free": ["learner.logprob_chunk_tokens=0", "learner.padding_free=true"],
    "all": ["learner.logprob_chunk_tokens={chunk}", "learner.max_tokens_per_micro_batch={budget}",
            "learner.padding_free=true"],
}
# a Qwen2.5 decoder scaled to a CPU (head size 64, Qwen2.5's 1:2 key/value heads and ~5.4x MLP, tied
# embeddings as in 0.5B and 1.5B) with the real vocabulary: the output head is most of its work
CPU_SHAPE = dict(hidden_size=256, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)


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
    parser.add_argument("--variants", default="",
                        help=f"learner settings to compare side by side, comma-separated: {', '.join(VARIANTS)} "
                             "(default: the recipe's settings)")
    parser.add_argument("--shape", default="recipe",
                        help="the model: recipe (its tiny model), qwen2.5-cpu (real vocabulary, small decoder) or a "
                             "built-in Qwen2.5 name such as Qwen/Qwen2.5-1.5B-Instruct (random weights)")
    parser.add_argument("--prompt-range", default="", help="LOW-HIGH: prompt lengths drawn uniformly (e.g. 700-1800)")
    parser.add_argument("--response-range", default="", help="LOW-HIGH: response lengths drawn uniformly (e.g. 10-250)")
    parser.add_argument("--max-tokens", type=int, default=0,
                        help="the token budget of the token_budget and all variants (default: micro-batch size x "
                             "mean row length)")
    parser.add_argument("--chunk-tokens", type=int, default=1024,
                        help="learner.logprob_chunk_tokens of the chunked and all variants (default 1024)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every row (repeatable), e.g. learner.micro_batch_size=4")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's default)")
    parser.add_argument("--warmup-rows", type=int, default=WARMUP_ROWS,
                        help=f"rows of the untimed warm-up pass and update (default {WARMUP_ROWS})")
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


def _span(text: str) -> tuple[int, int] | None:
    """``"LOW-HIGH"`` as two lengths (None for "")."""
    if not text:
        return None
    low, _, high = text.partition("-")
    if not (low.isdigit() and high.isdigit()) or not 1 <= int(low) <= int(high):
        raise ValueError(f"length range {text!r}: write LOW-HIGH, 1 <= LOW <= HIGH (e.g. 700-1800)")
    return int(low), int(high)


def make_batch(rows: int, prompt_tokens: int, response_tokens: int, vocab_size: int, seed: int,
               prompt_range: tuple[int, int] | None = None, response_range: tuple[int, int] | None = None):
    """``rows`` synthetic step records (8 per trajectory, 8 trajectories per group) with advantages;
    lengths within +-25 % (prompts) / +-50 % (responses) of the means, or uniform over the ranges."""
    import torch

    if rows < 1 or prompt_tokens < 1 or response_tokens < 1:
        raise ValueError("--rows, --prompt-tokens and --response-tokens must be >= 1")
    gen = torch.Generator().manual_seed(seed)

    def lengths(mean: int, spread: float, span: tuple[int, int] | None) -> list[int]:
        low, high = span or (max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread))))
        return torch.randint(low, high + 1, (rows,), generator=gen).tolist()

    records = []
    for i, (p, r) in enumerate(zip(lengths(prompt_tokens, 0.25, prompt_range),
                                   lengths(response_tokens, 0.5, response_range))):
        records.append({
            "group_id": i // 64, "traj_id": i // 8, "step": i % 8, "reward": 0.0, "done": i % 8 == 7,
            "success": False, "anchor_obs": "",
            "prompt_ids": torch.randint(0, vocab_size - 3, (p,), generator=gen).tolist(),
            "response_ids": torch.randint(0, vocab_size - 3, (r,), generator=gen).tolist(),
            "advantages": float(torch.randn((), generator=gen)),
        })
    return StepBatch.from_records(records, pad_id=vocab_size - 2)


def _shape_model(args, cfg, scratch: str):
    """The model to time, saved under ``scratch`` unless ``--model`` names one: (directory, its model)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if args.model:
        return args.model, load_model(args.model, torch.float32)
    if args.shape == "recipe":
        model = build_tiny_model(cfg.model.tiny, _Vocabulary(cfg.tokenizer.vocab_size), seed=args.seed)
    else:
        config = (Qwen2Config(**CPU_SHAPE, max_position_embeddings=32768, rope_theta=1e6, use_sliding_window=False)
                  if args.shape == "qwen2.5-cpu" else qwen25_config(args.shape))
        torch.manual_seed(args.seed)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):     # a 7B initialises in seconds there
            model = Qwen2ForCausalLM(config).to(torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    model.save_pretrained(scratch)
    return scratch, model.cpu()


def _return_freed_memory() -> None:
    """Give the memory the allocator keeps after earlier frees back to the system (glibc's
    ``malloc_trim``), so that a CPU stage's peak is measured from what is really in use: without it a
    stage that reuses a freed heap reads as adding nothing, and the reading depends on what ran before."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):       # not glibc: the reading stays coarser
        pass


class _StagePeak:
    """The most memory a stage adds on top of what was resident when it began, MB: the process's peak
    resident set on CPU (VmHWM, reset first), allocated CUDA memory on a GPU. Stages may nest: an inner
    one's reset would hide the outer one's earlier peak, so each hands its peak to the stages around it."""

    _open: list["_StagePeak"] = []

    def __init__(self, cuda: bool):
        self.cuda, self.mb, self.inner_peak = cuda, 0.0, 0

    @staticmethod
    def _status_kb(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key))

    def _peak_bytes(self) -> int:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return self._status_kb("VmHWM:") * 1024

    def __enter__(self) -> "_StagePeak":
        import torch

        for outer in self._open:        # what the outer stages saw so far, before the reset
            outer.inner_peak = max(outer.inner_peak, self._peak_bytes())
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            if not self._open:          # an outermost stage: an inner one must not move its outer one's start
                _return_freed_memory()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.start = self._status_kb("VmRSS:") * 1024
        self._open.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self._open.remove(self)
        peak = max(self._peak_bytes(), self.inner_peak)
        for outer in self._open:
            outer.inner_peak = max(outer.inner_peak, peak)
        self.mb = (peak - self.start) / 1e6


def _measure_micro_steps(learner, cuda: bool) -> list[float]:
    """From now on, the memory each micro-batch's forward and backward adds (the log-prob stage of the
    update: the model's activations, the logits and their gradient; not the optimizer step), MB."""
    peaks: list[float] = []
    step = learner._micro_step

    def measured(*args, **kwargs):
        with _StagePeak(cuda) as peak:
            out = step(*args, **kwargs)
        peaks.append(peak.mb)
        return out

    learner._micro_step = measured
    return peaks


def _rows(args, cfg, batch) -> dict[str, list[str]]:
    """Each row's name and its config overrides: precisions x variants (or the recipe's settings)."""
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown --variants {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    lengths = batch.prompt_lengths.float() + batch.response_mask.sum(1)
    budget = args.max_tokens or int(cfg.learner.micro_batch_size * float(lengths.mean()))
    rows = {}
    for precision in precisions:
        for variant in variants or [None]:
            name = precision if variant is None else (variant if len(precisions) == 1 else f"{precision} {variant}")
            settings = [s.format(budget=budget, chunk=args.chunk_tokens) for s in VARIANTS.get(variant, [])]
            rows[name] = list(args.set) + [f"learner.precision={precision}"] + settings
    return rows


def _measure(args) -> dict:
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.recipe, list(args.set))
    if cfg.model.name_or_path != "tiny":
        raise ValueError(f"agentrl bench learner measures tiny recipes; {args.recipe} uses {cfg.model.name_or_path}")
    results: dict[str, dict[str, float]] = {}
    first_logprobs = None
    cuda = cfg.trainer.device != "cpu" and torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-learner-") as scratch:
        model_dir, model = _shape_model(args, cfg, scratch)
        params, shape, vocab_size = sum(p.numel() for p in model.parameters()), model.config, model.config.vocab_size
        del model
        batch = make_batch(args.rows, args.prompt_tokens, args.response_tokens, vocab_size, args.seed,
                           _span(args.prompt_range), _span(args.response_range))
        warmup = batch.select(torch.arange(max(1, min(args.warmup_rows, len(batch)))))
        rows = _rows(args, cfg, batch)
        real_tokens = int(batch.prompt_lengths.sum() + batch.response_mask.sum())
        for name, overrides in rows.items():
            row_cfg = load_config(args.recipe, overrides)
            learner = Learner(row_cfg, model_dir)
            scored = learner.compute_logprobs(warmup)
            learner.update(scored)
            row: dict[str, float] = {}
            if first_logprobs is None:
                first_logprobs = scored.old_logprobs
            else:
                mask = scored.response_mask > 0
                gap = (scored.old_logprobs - first_logprobs).abs()[mask]
                row.update(logprob_gap_mean=float(gap.mean()), logprob_gap_max=float(gap.max()))
            with _StagePeak(cuda) as peak:
                start = time.perf_counter()
                scored = learner.compute_logprobs(batch)
                row["learner_pass_s"] = time.perf_counter() - start
            row["pass_peak_mb"] = peak.mb
            micro_peaks = _measure_micro_steps(learner, cuda)
            with _StagePeak(cuda) as peak:
                metrics = learner.update(scored)
            row.update(update_s=metrics["update_s"], tokens_per_s=metrics["tokens_per_s"],
                       optimizer_steps=metrics["optimizer_steps"], update_peak_mb=peak.mb,
                       micro_peak_mb=max(micro_peaks, default=0.0))
            row["total_s"] = row["learner_pass_s"] + row["update_s"]
            passes = 1 + (1 if row_cfg.learner.kl_coef > 0 else 0) + row_cfg.learner.ppo_epochs
            row["tokens_per_s_all"] = real_tokens * passes / row["total_s"]
            results[name] = row
            del learner
    base = next(iter(results.values()))["total_s"] if results else None
    for row in results.values():
        row["speedup"] = base / row["total_s"] if base else 1.0
    lc = cfg.learner
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkldnn_bf16": _bf16_kernels(), "device": torch.cuda.get_device_name() if cuda else "cpu",
            "recipe": args.recipe, "rows": len(batch), "tokens": real_tokens,
            "mini_batch_size": lc.mini_batch_size, "micro_batch_size": lc.micro_batch_size, "ppo_epochs": lc.ppo_epochs,
            "kl_coef": lc.kl_coef, "settings": {name: overrides for name, overrides in rows.items()},
            "weights": args.model or "random",
            "model": f"qwen2 hidden {shape.hidden_size}, {shape.num_hidden_layers} layers, {params} params, "
                     f"vocab {vocab_size}"}
    return {"meta": meta, "results": results}


def run(args) -> int:
    return run_report(args, _measure, _show)


def _show(meta: dict, rows: dict) -> None:
    print(f"learner benchmark ({meta['recipe']}): {meta['model']}, {meta['weights']} weights; {meta['rows']} rows, "
          f"{meta['tokens']} tokens, mini-batch {meta['mini_batch_size']}, micro-batch {meta['micro_batch_size']}, "
          f"{meta['ppo_epochs']} epoch(s), "
          f"kl_coef {meta['kl_coef']}; {meta['device']}; {meta['cpu']} ({meta['cpu_capability']}, bf16 kernels: "
          f"{meta['mkldnn_bf16']}), {meta['cores']} cores, {meta['torch_threads']} torch threads")
    width = max([11] + [len(name) + 2 for name in rows])
    print(f"{'row':<{width}}{'pass s':>8}{'update s':>10}{'total s':>9}{'tokens/s':>10}{'all tok/s':>10}"
          f"{'speed-up':>10}{'pass MB':>9}{'micro MB':>10}{'update MB':>11}{'logprob gap mean / max':>26}")
    for name, row in rows.items():
        gap = (f"{row['logprob_gap_mean']:.2e} / {row['logprob_gap_max']:.2e}" if "logprob_gap_mean" in row else "-")
        print(f"{name:<{width}}{row['learner_pass_s']:>8.2f}{row['update_s']:>10.2f}{row['total_s']:>9.2f}"
              f"{row['tokens_per_s']:>10.0f}{row['tokens_per_s_all']:>10.0f}{row['speedup']:>9.2f}x"
              f"{row['pass_peak_mb']:>9.0f}{row['micro_peak_mb']:>10.0f}{row['update_peak_mb']:>11.0f}{gap:>26}")
