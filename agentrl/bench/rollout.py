"""``agentrl bench rollout``: rollout throughput of the engine against a naive loop.

The workload is a tiny recipe's (default ``textcraft_grpo_tiny``), read from the recipe itself so
the benchmark measures what ``agentrl train`` runs: its tiny Qwen2 model (random weights; layers,
width and heads from ``model.tiny``), its tokenizer (a BPE of ``tokenizer.vocab_size`` trained
on the env's expert text, as the trainer does), its rollout settings (prompt style, history,
admissible list, ``max_prompt_tokens`` and ``prompt_truncation``, ``max_response_tokens``,
temperature, top-p/top-k), its ``env.max_steps``, ``env.train_split`` and
``tasks_per_iteration x group_size`` episodes. Flags override single settings; ``--override
KEY=VALUE`` any config key (the model's shape and tokenizer too).

* ``engine``: :class:`~agentrl.rollout.engine.RolloutEngine` with the batched torch backend (all
  active envs in one generate call, KV cache, shared prefill of common prompt beginnings);
* ``engine-no-prefix-sharing``: the same without the shared prefill (what sharing saves);
* ``engine-hidden``: the engine recording BiPACE's hidden state in the prefill
  (``record_hidden(algorithm.bipace.hidden_layer)``; what that costs the rollout);
* ``vllm``: the engine with the vLLM backend, when vllm is importable (``.venv-vllm``);
* ``vllm-raw``: the physical limit on this machine: every ``generate`` call the ``vllm`` engine
  made (the very same token-id prompts, batches and sampling settings, seeds included) replayed
  through ``LLM.generate`` alone, from a cold prefix cache like the engine's run; no environment,
  no prompt building. ``engine_overhead_vs_raw`` = engine seconds / raw seconds - 1 (goal <= 10 %);
* ``naive``: one env at a time, Hugging Face ``generate`` per step, no batching, on the same
  prompts (same template, history and truncation) with the same sampling settings.

Paper recipes (``--recipe alfworld_bipace_qwen7b --device cuda --backends vllm``) run the
architecture with random weights (``model.random_init``; no download) on the GPU, without the naive
baseline: the 1.5B and 7B shapes of the engine against raw vLLM.

Reported: env steps/s, generated tokens/s, seconds, and the speed-up over ``naive``; also each
variant's CPU seconds (``time.process_time`` of this process) and the speed-up in env steps per
CPU second, which moves less than wall time on a machine shared with other jobs. A random
model rarely writes a valid action, so every episode runs the full ``env.max_steps`` in every
variant and the step counts are equal.
"""

from __future__ import annotations

import os
import tempfile
import time

from agentrl.bench._common import cpu_name, run_report
from agentrl.config.loading import load_config
from agentrl.envs import TaskRef, make_env
from agentrl.envs.server import EnvClient
from agentrl.generation import TorchBackend
from agentrl.generation.vllm import VllmBackend
from agentrl.models import (build_tiny_model, load_tokenizer, prepare_initial_model, resolve_dtype,
                            stop_token_ids, train_tokenizer)
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.parsing import parse_response
from agentrl.rollout.prompts import History, task_text
from agentrl.warmstart.starting_policy import corpus_builder

HELP = "rollout throughput: batched engine (torch, vllm) vs one env at a time with HF generate"


def add_arguments(parser) -> None:
    parser.add_argument("--recipe", default="textcraft_grpo_tiny",
                        help="tiny recipe whose model, tokenizer, prompts and episodes are measured "
                             "(default textcraft_grpo_tiny)")
    parser.add_argument("--split", default=None, help="task split (default: the recipe's env.train_split)")
    parser.add_argument("--tasks", type=int, default=None,
                        help="distinct tasks (default: the recipe's env.tasks_per_iteration)")
    parser.add_argument("--group-size", type=int, default=None,
                        help="episodes per task (default: the recipe's env.group_size)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="steps per episode (default: the recipe's env.max_steps)")
    parser.add_argument("--max-response-tokens", type=int, default=None,
                        help="tokens per response (default: the recipe's rollout.max_response_tokens)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default: the recipe's rollout.temperature)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--backends", default="torch,vllm",
                        help="engine backends to measure, comma-separated; vllm is skipped where it is not "
                             "installed (default torch,vllm)")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive baseline (profiling runs)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the model runs; cuda also takes paper recipes (random weights of the architecture)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override applied after the flags, to the workload and the model it builds "
                             "(repeatable), e.g. rollout.vllm.enforce_eager=true on a GPU's first start")


def workload(args):
    """The recipe's config with the flags' overrides applied (what every variant runs)."""
    overrides = []
    for flag, key in (("split", "env.train_split"), ("tasks", "env.tasks_per_iteration"),
                      ("group_size", "env.group_size"), ("max_steps", "env.max_steps"),
                      ("max_response_tokens", "rollout.max_response_tokens"), ("temperature", "rollout.temperature")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    if getattr(args, "device", "cpu") == "cuda":
        overrides += ["model.random_init=true", "trainer.device=cuda"]
    cfg = load_config(args.recipe, overrides + list(getattr(args, "override", None) or []))
    if cfg.model.name_or_path != "tiny" and getattr(args, "device", "cpu") != "cuda":
        raise ValueError(f"{args.recipe} uses {cfg.model.name_or_path}: on CPU agentrl bench rollout measures tiny "
                         "recipes; a paper recipe's shape runs with --device cuda (random weights)")
    return cfg


def _build_model(cfg, seed: int, out_dir: str):
    if cfg.model.name_or_path != "tiny":     # a paper shape with random weights, written to out_dir
        path = prepare_initial_model(cfg.model, cfg.tokenizer, f"{out_dir}/model", corpus=corpus_builder(cfg), seed=seed)
        return None, load_tokenizer(path), path
    tokenizer = train_tokenizer(corpus_builder(cfg)(), cfg.tokenizer.vocab_size)
    model = build_tiny_model(cfg.model.tiny, tokenizer, seed=seed).eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model, tokenizer, out_dir


class RecordingBackend:
    """A backend that passes every call through and keeps each ``generate`` call's prompts and
    sampling settings (what ``vllm-raw`` replays)."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def generate(self, prompt_ids, sampling):
        self.calls.append(([list(p) for p in prompt_ids], sampling))
        return self.backend.generate(prompt_ids, sampling)

    def __getattr__(self, name):
        return getattr(self.backend, name)


def _replay_raw(backend, calls) -> dict[str, float]:
    """The recorded calls through ``LLM.generate`` alone (the engine's own conversion of the sampling
    settings, so both ask vLLM for exactly the same thing), from a cold prefix cache."""
    backend.llm.reset_prefix_cache()
    tokens = 0
    start, cpu = time.perf_counter(), time.process_time()
    for prompts, sampling in calls:
        requests = [{"prompt_token_ids": p} for p in prompts]
        params = [backend.vllm_sampling_params(sampling, i) for i in range(len(prompts))]
        outputs = backend.llm.generate(requests, params, use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "cpu_s": time.process_time() - cpu, "env_steps": sum(len(p) for p, _ in calls),
            "generated_tokens": tokens, "generate_s": seconds, "prompt_tokens": sum(len(x) for p, _ in calls for x in p)}


def _env_kwargs(cfg) -> dict:
    return {"max_steps": cfg.env.max_steps, **dict(cfg.env.kwargs)}


def _run_engine(backend, tokenizer, cfg, tasks, seed: int) -> dict[str, float]:
    group_size = cfg.env.group_size
    client = EnvClient.local(cfg.env.name, len(tasks) * group_size, _env_kwargs(cfg))
    engine = RolloutEngine(backend, tokenizer, client, cfg.rollout, cfg.env)
    engine.run(tasks[:1], min(2, group_size), seed=seed + 1)  # warm-up (first-call costs)
    if isinstance(backend, RecordingBackend):     # record the measured run only, from a cold prefix cache
        backend.calls.clear()
        backend.llm.reset_prefix_cache()
    start, cpu = time.perf_counter(), time.process_time()
    result = engine.run(tasks, group_size, seed=seed)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    client.close()
    return {"seconds": seconds, "cpu_s": cpu, "env_steps": result.stats["env_steps"],
            "generated_tokens": result.stats["generated_tokens"], "generate_s": result.stats["generate_s"],
            "prompt_tokens": result.stats["prompt_tokens"], "truncated_prompts": result.stats["truncated_prompts"]}


def _run_naive(model, tokenizer, cfg, tasks, seed: int) -> dict[str, float]:
    """One env at a time, Hugging Face generate on each step's prompt, no batching.

    The prompts are the engine's (same text, chat template and left truncation to
    ``rollout.max_prompt_tokens``), and so are the sampling settings and stop tokens."""
    import torch

    rollout = cfg.rollout
    env = make_env(cfg.env.name, **_env_kwargs(cfg))
    # only its prompt building and truncation are used: the same code as the measured engine
    prompts = RolloutEngine(None, tokenizer, _NoEnvs(), rollout, cfg.env, env_name=cfg.env.name)
    stops = stop_token_ids(tokenizer)
    sampling = dict(do_sample=True, temperature=rollout.temperature, top_p=rollout.top_p,
                    top_k=rollout.top_k if rollout.top_k > 0 else 0) if rollout.temperature > 0 else dict(do_sample=False)
    torch.manual_seed(seed)
    steps = tokens = prompt_tokens = 0
    generate_s = 0.0
    start, cpu = time.perf_counter(), time.process_time()
    for task in tasks:
        for _ in range(cfg.env.group_size):
            obs, info = env.reset(task)
            reset_obs, reset_info = obs, info
            history = History()
            for _step in range(cfg.env.max_steps):
                text = prompts.prompt_text(task_text(cfg.env.name, reset_obs, reset_info, info), obs, history,
                                           info.get("admissible_actions") or [])
                (ids,), _truncated = prompts.encode_prompts([text])
                input_ids = torch.tensor([ids])
                prompt_tokens += len(ids)
                t0 = time.perf_counter()
                with torch.no_grad():
                    out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                         max_new_tokens=rollout.max_response_tokens, eos_token_id=stops,
                                         pad_token_id=tokenizer.pad_token_id, **sampling)
                generate_s += time.perf_counter() - t0
                response = out[0, input_ids.shape[1]:]
                tokens += int(response.numel())
                parsed = parse_response(tokenizer.decode(response, skip_special_tokens=True), cfg.env.name,
                                        require_think=rollout.enable_thinking)
                history.add(obs, parsed.action)
                obs, _reward, terminated, truncated, info = env.step(parsed.action)
                steps += 1
                if terminated or truncated:
                    break
    return {"seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu, "env_steps": steps,
            "generated_tokens": tokens, "generate_s": generate_s, "prompt_tokens": prompt_tokens}


class _NoEnvs:
    """An env client with one (unused) instance: the naive loop borrows the engine's prompt code."""

    size = 1
    env_name = None


def run(args) -> int:
    return run_report(args, _measure, _show)


def _show(meta: dict, rows: dict) -> None:
    print(f"rollout benchmark ({meta['recipe']}): {meta['model']}; {meta['tasks']} tasks x {meta['group_size']} envs "
          f"x {meta['max_steps']} steps on {meta['split']}, prompts <= {meta['max_prompt_tokens']} tokens "
          f"({meta['prompt_truncation']}), {meta['max_response_tokens']} tokens/response; {meta['cpu']}, "
          f"{meta['cores']} cores, {meta['torch_threads']} torch threads")
    print(f"{'variant':<26}{'seconds':>9}{'env steps':>11}{'steps/s':>9}{'gen tok/s':>11}{'speed-up':>10}"
          f"{'CPU s':>8}{'CPU speed-up':>14}")
    for name, row in rows.items():
        speedup = f"{row['speedup_vs_naive']:>9.1f}x" if "speedup_vs_naive" in row else f"{'-':>10}"
        cpu_speedup = f"{row['cpu_speedup_vs_naive']:>13.1f}x" if "cpu_speedup_vs_naive" in row else f"{'-':>14}"
        print(f"{name:<26}{row['seconds']:>9.2f}{int(row['env_steps']):>11}{row['env_steps_per_s']:>9.1f}"
              f"{row['generated_tokens_per_s']:>11.0f}{speedup}{row['cpu_s']:>8.1f}{cpu_speedup}")
    if "engine_overhead_vs_raw" in rows.get("vllm", {}):
        print(f"the engine with vLLM against raw LLM.generate on the same calls: "
              f"{rows['vllm']['engine_overhead_vs_raw']:+.1%} time (goal <= +10 %)")


def _measure(args) -> dict:
    import torch

    torch.set_num_threads(max(1, args.threads))
    cfg = workload(args)
    device = args.device
    paper = cfg.model.name_or_path != "tiny"
    tasks = [TaskRef(cfg.env.train_split, i) for i in range(cfg.env.tasks_per_iteration)]
    rows: dict[str, dict[str, float]] = {}
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-rollout-") as model_dir:
        # the recipe's tokenizer and model whatever the flags (its corpus depends on env.max_steps), with
        # the --override items
        model_cfg = load_config(args.recipe, (["model.random_init=true"] if paper else []) + list(args.override))
        model, tokenizer, model_path = _build_model(model_cfg, args.seed, model_dir)
        dtype = resolve_dtype(cfg.model.dtype, device)
        if model is None and "torch" in wanted:
            model = TorchBackend.from_pretrained(model_path, device=device, dtype=dtype).model
        if model is not None and device == "cuda":
            model = model.to(device="cuda", dtype=dtype)
        if not args.no_naive and not paper:
            rows["naive"] = _run_naive(model, tokenizer, cfg, tasks, args.seed)
        if "torch" in wanted:
            rows["engine"] = _run_engine(TorchBackend(model, tokenizer), tokenizer, cfg, tasks, args.seed)
            rows["engine-no-prefix-sharing"] = _run_engine(TorchBackend(model, tokenizer, share_prefixes=False),
                                                           tokenizer, cfg, tasks, args.seed)
            recording = TorchBackend(model, tokenizer)
            recording.record_hidden(cfg.algorithm.bipace.hidden_layer)
            rows["engine-hidden"] = _run_engine(recording, tokenizer, cfg, tasks, args.seed)
        if "vllm" in wanted and VllmBackend.installed():
            backend = VllmBackend(model_path, max_model_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens,
                                  seed=args.seed, device=device, dtype=dtype,
                                  vllm_cfg=cfg.rollout.vllm if device == "cuda" else None)
            recorder = RecordingBackend(backend)
            rows["vllm"] = _run_engine(recorder, tokenizer, cfg, tasks, args.seed)
            rows["vllm-raw"] = _replay_raw(backend, recorder.calls)
            rows["vllm"]["engine_overhead_vs_raw"] = rows["vllm"]["seconds"] / rows["vllm-raw"]["seconds"] - 1
            backend.close()
    base = rows["naive"]["env_steps"] / rows["naive"]["seconds"] if "naive" in rows else None
    base_cpu = rows["naive"]["env_steps"] / rows["naive"]["cpu_s"] if "naive" in rows else None
    for row in rows.values():
        row["env_steps_per_s"] = row["env_steps"] / row["seconds"]
        row["generated_tokens_per_s"] = row["generated_tokens"] / row["seconds"]
        row["env_steps_per_cpu_s"] = row["env_steps"] / row["cpu_s"]
        if base:
            row["speedup_vs_naive"] = row["env_steps_per_s"] / base
            row["cpu_speedup_vs_naive"] = row["env_steps_per_cpu_s"] / base_cpu
    tiny = cfg.model.tiny
    described = (f"{cfg.model.name_or_path} (random weights)" if paper else
                 f"qwen2 hidden {tiny.hidden_size}, {tiny.num_layers} layers, "
                 f"{sum(p.numel() for p in model.parameters())} params, vocab {len(tokenizer)}")
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device,
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "recipe": args.recipe, "env": cfg.env.name, "split": cfg.env.train_split,
            "tasks": cfg.env.tasks_per_iteration, "group_size": cfg.env.group_size, "max_steps": cfg.env.max_steps,
            "max_prompt_tokens": cfg.rollout.max_prompt_tokens, "prompt_truncation": cfg.rollout.prompt_truncation,
            "max_response_tokens": cfg.rollout.max_response_tokens, "temperature": cfg.rollout.temperature,
            "model": described}
    return {"meta": meta, "results": rows}
