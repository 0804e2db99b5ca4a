"""``agentrl bench gateway``: env steps/s of an outside agent through the gateway against agentrl's own loop.

The same workload as ``agentrl bench rollout`` (a tiny recipe's model with random weights, its
tokenizer, prompts and episodes): ``engine`` is :class:`~agentrl.rollout.engine.RolloutEngine`
in process (every active episode's step in one generate call); ``gateway`` the same episodes played
by ``agentrl.agents.textcraft_openai`` (``--agent`` for another) through
:class:`~agentrl.rollout.agents.engine.AgentEngine`: one thread and one ``openai`` client per episode, HTTP
to the gateway, the calls that arrive together batched into one generate call, the env stepped
per episode; ``--agent-processes N``: the agents in N processes of their own (their CPU counted).
The two run interleaved, ``--rounds`` times each, on the same backend and tasks and
seeds; reported: env steps/s of each (median over rounds), ``gateway_vs_engine`` (goal >= 0.9),
and the gateway's requests per engine call. ``--backend vllm`` (where vllm imports: ``.venv-vllm`` on
CPU; ``--device cuda`` on a GPU, with the recipe's dtype and ``rollout.vllm.*``, a paper recipe's
shape with random weights) runs both on one vLLM engine: the engine's calls on this thread, the
gateway's on its batcher thread.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from agentrl.bench._common import cpu_name, run_report
from agentrl.bench.rollout import _build_model, _env_kwargs, workload
from agentrl.config.loading import load_config
from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.generation import TorchBackend
from agentrl.generation.base import Generation, GenerationBackend
from agentrl.generation.vllm import VllmBackend
from agentrl.models import resolve_dtype
from agentrl.rollout.agents.engine import AgentEngine
from agentrl.rollout.engine import RolloutEngine

HELP = "outside agent through the OpenAI-compatible gateway vs agentrl's own loop: env steps/s"


def add_arguments(parser) -> None:
    parser.add_argument("--recipe", default="textcraft_grpo_tiny", help="tiny recipe (default textcraft_grpo_tiny)")
    parser.add_argument("--agent", default="agentrl.agents.textcraft_openai:run_episode",
                        help="the outside agent (module:function), playing the recipe's environment")
    parser.add_argument("--agent-processes", type=int, default=0,
                        help="play the agents in this many processes (rollout.agent_processes; default 0: threads)")
    parser.add_argument("--instant-engine", action="store_true",
                        help="replace the model by an engine that answers at once (a fixed valid reply): what the "
                             "loop and the gateway cost around a generation that costs nothing")
    parser.add_argument("--tasks", type=int, default=None, help="tasks (default: env.tasks_per_iteration)")
    parser.add_argument("--group-size", type=int, default=None, help="episodes per task (default: env.group_size)")
    parser.add_argument("--max-steps", type=int, default=None, help="steps per episode (default: env.max_steps)")
    parser.add_argument("--max-response-tokens", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--backend", default="torch", choices=("torch", "vllm"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")


def _make_backend(kind: str, model, tokenizer, path: str, cfg, device: str, seed: int):
    """The backend both loops share: the torch engine over the model, or vLLM over its directory (on a GPU
    with the recipe's dtype and ``rollout.vllm.*``, as the rollout workers build it)."""
    dtype = resolve_dtype(cfg.model.dtype, device)
    if kind == "torch":
        if model is None:          # a paper recipe's shape (random weights): written to path
            return TorchBackend.from_pretrained(path, device=device, dtype=dtype)
        return TorchBackend(model.to(device=device, dtype=dtype) if device == "cuda" else model, tokenizer)

    return VllmBackend(path, max_model_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens, seed=seed,
                       device=device, dtype=dtype, vllm_cfg=cfg.rollout.vllm if device == "cuda" else None)


def _instant_engine(tokenizer):
    """A generation backend that costs nothing: every request gets the same valid TextCraft reply
    (``inventory``), log-prob 0, so episodes run their full length on both sides and what is measured
    is the loop, the HTTP stack and the agents: the ceiling an infinitely fast engine would leave."""

    reply = list(tokenizer("<think>look</think><action>inventory</action>", add_special_tokens=False)["input_ids"])

    class InstantEngine(GenerationBackend):
        name = "instant"

        def generate(self, prompt_ids, sampling):
            ids = reply[:sampling.max_tokens]
            return [Generation(list(ids), [0.0] * len(ids), "stop") for _ in prompt_ids]

        def load_weights(self, state_dict) -> None:
            pass

    return InstantEngine()


def _cpu_seconds(engine) -> float:
    """This process's CPU time, and its agent processes' (rollout.agent_processes)."""
    processes = getattr(engine, "processes", None)
    return time.process_time() + (processes.cpu_seconds() if processes is not None else 0.0)


def _timed(engine, tasks, group_size: int, seed: int) -> dict[str, float]:
    start, cpu = time.perf_counter(), _cpu_seconds(engine)
    result = engine.run(tasks, group_size, seed=seed)
    return {"seconds": time.perf_counter() - start, "cpu_s": _cpu_seconds(engine) - cpu,
            "env_steps": float(result.stats.get("env_steps", 0)), "episodes": float(len(result.episodes)),
            "failed": float(result.stats.get("env_failures", 0))}


def _measure(args) -> dict:
    import torch

    torch.set_num_threads(max(1, args.threads))
    args.split, args.temperature = None, None
    cfg = workload(args)
    cfg.rollout.agent_processes = max(0, int(getattr(args, "agent_processes", 0)))
    tasks = [TaskRef(cfg.env.train_split, i) for i in range(cfg.env.tasks_per_iteration)]
    size = len(tasks) * cfg.env.group_size
    runs: dict[str, list[dict[str, float]]] = {"engine": [], "gateway": []}
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-gateway-") as model_dir:
        # a paper recipe (--device cuda) gets its shape with random weights, as in `agentrl bench rollout`
        paper = cfg.model.name_or_path != "tiny"
        model_cfg = load_config(args.recipe, (["model.random_init=true"] if paper else []) + list(args.override))
        model, tokenizer, path = _build_model(model_cfg, args.seed, model_dir)
        backend = (_instant_engine(tokenizer) if getattr(args, "instant_engine", False) else
                   _make_backend(args.backend, model, tokenizer, path, cfg, args.device, args.seed))
        vllm_version = ".".join(map(str, backend.version)) if hasattr(backend, "version") else None
        clients = [EnvClient.local(cfg.env.name, size, _env_kwargs(cfg)) for _ in range(2)]
        engines = {"engine": RolloutEngine(backend, tokenizer, clients[0], cfg.rollout, cfg.env),
                   "gateway": AgentEngine(backend, tokenizer, clients[1], cfg.rollout, cfg.env,
                                          agent=args.agent)}
        try:
            for engine in engines.values():                       # warm-up: first-call costs
                engine.run(tasks[:1], min(2, cfg.env.group_size), seed=args.seed + 1)
            for round_ in range(args.rounds):
                order = ("engine", "gateway") if round_ % 2 == 0 else ("gateway", "engine")
                for name in order:
                    runs[name].append(_timed(engines[name], tasks, cfg.env.group_size, args.seed + round_))
            batcher = engines["gateway"].gateway.batcher
            per_call = batcher.requests / max(1, batcher.calls)
        finally:
            engines["gateway"].close()
            for client in clients:
                client.close()
            getattr(backend, "close", lambda: None)()
    rows = {}
    for name, measured in runs.items():
        rates = [m["env_steps"] / m["seconds"] for m in measured]
        rows[name] = {"env_steps_per_s": statistics.median(rates), "rounds": rates,
                      "env_steps_per_cpu_s": statistics.median(m["env_steps"] / m["cpu_s"] for m in measured),
                      "env_steps": measured[-1]["env_steps"], "failed_episodes": sum(m["failed"] for m in measured)}
    rows["gateway"]["requests_per_engine_call"] = per_call
    rows["gateway"]["gateway_vs_engine"] = rows["gateway"]["env_steps_per_s"] / rows["engine"]["env_steps_per_s"]
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "recipe": args.recipe, "agent": args.agent, "device": args.device,
            "backend": "instant" if getattr(args, "instant_engine", False) else args.backend,
            "vllm": vllm_version,
            "tasks": len(tasks), "group_size": cfg.env.group_size, "max_steps": cfg.env.max_steps,
            "rounds": args.rounds, "agent_processes": cfg.rollout.agent_processes, "load_avg": os.getloadavg()[0]}
    return {"meta": meta, "results": rows}


def _show(meta: dict, rows: dict) -> None:
    backend = f"vllm {meta['vllm']}" if meta.get("vllm") else meta["backend"]
    print(f"{meta['recipe']}: {meta['tasks']} tasks x {meta['group_size']} episodes, up to {meta['max_steps']} steps, "
          f"{backend} on {meta['device']} ({meta['cpu']}, {meta['torch_threads']} thread(s)), "
          f"{meta['rounds']} interleaved rounds, agents in "
          f"{meta.get('agent_processes') or 'threads of the'} {'processes' if meta.get('agent_processes') else 'worker'}, "
          f"load {meta['load_avg']:.1f}")
    for name, row in rows.items():
        rounds = ", ".join(f"{r:.1f}" for r in row["rounds"])
        print(f"  {name:8s} {row['env_steps_per_s']:8.1f} env steps/s (median; rounds {rounds}), "
              f"{row['env_steps_per_cpu_s']:.1f} per CPU second")
    print(f"  gateway / engine: {rows['gateway']['gateway_vs_engine']:.2f}x (goal >= 0.9); "
          f"{rows['gateway']['requests_per_engine_call']:.1f} requests per engine call")


def run(args) -> int:
    return run_report(args, _measure, _show)
