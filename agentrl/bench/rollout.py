"""``agentrl bench rollout``: rollout throughput of the engine against a naive loop.

A tiny Qwen2 model (random weights) with a byte-level BPE trained on TextCraft expert text plays
``tasks x group_size`` episodes of ``--max-steps`` steps, sampling at temperature 1, with the tiny
recipes' prompt settings (compact prompts, history of 2, no thinking, 24 response tokens, no
admissible-action list for TextCraft):

* ``engine``: :class:`~agentrl.rollout.engine.RolloutEngine` with the batched torch backend (all
  active envs in one generate call, KV cache, shared prefill of common prompt beginnings);
* ``engine-no-prefix-sharing``: the same without the shared prefill (what sharing saves);
* ``vllm``: the engine with the vLLM backend, when vllm is importable (``.venv-vllm``);
* ``naive``: one env at a time, Hugging Face ``generate`` per step, no batching.

Reported: env steps/s, generated tokens/s, seconds, and the speed-up over ``naive``. A random
model rarely writes a valid action, so every episode runs the full ``--max-steps`` in every
variant and the step counts are equal.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time

HELP = "rollout throughput: batched engine (torch, vllm) vs one env at a time with HF generate"


def add_arguments(parser) -> None:
    parser.add_argument("--env", default="textcraft", help="environment (default textcraft)")
    parser.add_argument("--split", default="depth2", help="task split (default depth2)")
    parser.add_argument("--tasks", type=int, default=4, help="distinct tasks (default 4)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per task (default 8)")
    parser.add_argument("--max-steps", type=int, default=4, help="steps per episode (default 4)")
    parser.add_argument("--max-response-tokens", type=int, default=24,
                        help="tokens per response (default 24, the tiny recipes' limit)")
    parser.add_argument("--hidden", type=int, default=128, help="tiny model hidden size (default 128)")
    parser.add_argument("--layers", type=int, default=2, help="tiny model layers (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--backends", default="torch,vllm",
                        help="engine backends to measure, comma-separated; vllm is skipped where it is not "
                             "installed (default torch,vllm)")
    parser.add_argument("--seed", type=int, default=0)


def _build_model(args, out_dir: str):
    from agentrl.config.schema import TinyModelConfig
    from agentrl.data.demonstrations import corpus_texts
    from agentrl.models import build_tiny_model, train_tokenizer

    texts = corpus_texts(args.env, {}, "train", 200, history_length=2, think=False, style="compact",
                         show_admissible=_show_admissible(args))
    tokenizer = train_tokenizer(texts, vocab_size=2048, kind="bpe")
    heads = max(1, args.hidden // 32)
    tiny = TinyModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=heads,
                           num_kv_heads=1 if heads == 1 else heads // 2, intermediate_size=4 * args.hidden)
    model = build_tiny_model(tiny, tokenizer, seed=args.seed).eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model, tokenizer


def _show_admissible(args) -> bool:
    return args.env != "textcraft"  # as the recipes: TextCraft's commands are in its task text


def _configs(args):
    from agentrl.config.schema import EnvConfig, RolloutConfig

    rollout = RolloutConfig(max_response_tokens=args.max_response_tokens, prompt_style="compact", enable_thinking=False,
                            show_admissible=_show_admissible(args),
                            max_prompt_tokens=2048, prompt_truncation="left", temperature=1.0)
    env = EnvConfig(name=args.env, max_steps=args.max_steps, group_size=args.group_size,
                    tasks_per_iteration=args.tasks, history_length=2)
    return rollout, env


def _run_engine(backend, tokenizer, args, tasks) -> dict[str, float]:
    from agentrl.envs.server import EnvClient
    from agentrl.rollout.engine import RolloutEngine

    rollout_cfg, env_cfg = _configs(args)
    client = EnvClient.local(args.env, len(tasks) * args.group_size, {"max_steps": args.max_steps})
    engine = RolloutEngine(backend, tokenizer, client, rollout_cfg, env_cfg)
    engine.run(tasks[:1], 2, seed=args.seed + 1)  # warm-up (first-call costs)
    start = time.perf_counter()
    result = engine.run(tasks, args.group_size, seed=args.seed)
    seconds = time.perf_counter() - start
    client.close()
    return {"seconds": seconds, "env_steps": result.stats["env_steps"],
            "generated_tokens": result.stats["generated_tokens"], "generate_s": result.stats["generate_s"]}


def _run_naive(model, tokenizer, args, tasks) -> dict[str, float]:
    """One env at a time, Hugging Face generate on each step's prompt, no batching."""
    import torch

    from agentrl.envs import make_env
    from agentrl.models import stop_token_ids
    from agentrl.rollout.parsing import parse_response
    from agentrl.rollout.prompts import History, build_prompt_text, render_chat, task_text

    env = make_env(args.env, max_steps=args.max_steps)
    stops = stop_token_ids(tokenizer)
    torch.manual_seed(args.seed)
    steps = tokens = 0
    generate_s = 0.0
    start = time.perf_counter()
    for task in tasks:
        for _ in range(args.group_size):
            obs, info = env.reset(task)
            task_line = task_text(args.env, obs, info)
            history = History()
            for _step in range(args.max_steps):
                admissible = info["admissible_actions"] if _show_admissible(args) else []
                text = build_prompt_text(args.env, task_line, obs, history, admissible,
                                         history_length=2, think=False, style="compact")
                ids = tokenizer(render_chat(tokenizer, text), add_special_tokens=False, return_tensors="pt")
                t0 = time.perf_counter()
                with torch.no_grad():
                    out = model.generate(**ids, max_new_tokens=args.max_response_tokens, do_sample=True,
                                         temperature=1.0, top_p=1.0, top_k=0, eos_token_id=stops,
                                         pad_token_id=tokenizer.pad_token_id)
                generate_s += time.perf_counter() - t0
                response = out[0, ids["input_ids"].shape[1]:]
                tokens += int(response.numel())
                parsed = parse_response(tokenizer.decode(response, skip_special_tokens=True), args.env,
                                        require_think=False)
                history.add(obs, parsed.action)
                obs, _reward, terminated, truncated, info = env.step(parsed.action)
                steps += 1
                if terminated or truncated:
                    break
    return {"seconds": time.perf_counter() - start, "env_steps": steps, "generated_tokens": tokens,
            "generate_s": generate_s}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(args) -> int:
    if not args.json:
        return _run(args)
    # libraries print warnings on stdout (DeepSpeed's accelerator notice): keep stdout for the JSON
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        report = _measure(args)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    print(json.dumps(report, indent=2))
    return 0


def _run(args) -> int:
    report = _measure(args)
    meta, rows = report["meta"], report["results"]
    print(f"rollout benchmark: {meta['model']}; {args.tasks} tasks x {args.group_size} envs x {args.max_steps} steps, "
          f"{args.max_response_tokens} tokens/response; {meta['cpu']}, {meta['cores']} cores, "
          f"{meta['torch_threads']} torch threads")
    print(f"{'variant':<26}{'seconds':>9}{'env steps':>11}{'steps/s':>9}{'gen tok/s':>11}{'speed-up':>10}")
    for name, row in rows.items():
        print(f"{name:<26}{row['seconds']:>9.2f}{int(row['env_steps']):>11}{row['env_steps_per_s']:>9.1f}"
              f"{row['generated_tokens_per_s']:>11.0f}{row['speedup_vs_naive']:>9.1f}x")
    return 0


def _measure(args) -> dict:
    import torch

    from agentrl.envs import TaskRef
    from agentrl.rollout.backends import TorchBackend, vllm_available

    torch.set_num_threads(max(1, args.threads))
    tasks = [TaskRef(args.split, i) for i in range(args.tasks)]
    rows: dict[str, dict[str, float]] = {}
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-rollout-") as model_dir:
        model, tokenizer = _build_model(args, model_dir)
        rows["naive"] = _run_naive(model, tokenizer, args, tasks)
        if "torch" in wanted:
            rows["engine"] = _run_engine(TorchBackend(model, tokenizer), tokenizer, args, tasks)
            rows["engine-no-prefix-sharing"] = _run_engine(TorchBackend(model, tokenizer, share_prefixes=False),
                                                           tokenizer, args, tasks)
        if "vllm" in wanted and vllm_available():
            from agentrl.rollout.backends.vllm_engine import VllmBackend

            backend = VllmBackend(model_dir, max_model_len=2048, seed=args.seed)
            rows["vllm"] = _run_engine(backend, tokenizer, args, tasks)
            backend.close()
    base = rows["naive"]["env_steps"] / rows["naive"]["seconds"]
    for row in rows.values():
        row["env_steps_per_s"] = row["env_steps"] / row["seconds"]
        row["generated_tokens_per_s"] = row["generated_tokens"] / row["seconds"]
        row["speedup_vs_naive"] = row["env_steps_per_s"] / base
    meta = {"cpu": _cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "env": args.env, "split": args.split, "tasks": args.tasks, "group_size": args.group_size,
            "max_steps": args.max_steps, "max_response_tokens": args.max_response_tokens,
            "model": f"qwen2 hidden {args.hidden}, {args.layers} layers, {sum(p.numel() for p in model.parameters())} params"}
    return {"meta": meta, "results": rows}
