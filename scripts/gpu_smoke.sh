#!/usr/bin/env bash
# The GPU smoke alone: the GPU checklist's imports, probe and smoke stages (scripts/gpu_checklist.sh,
# agentrl.checklist), for smoke runs of other recipes or settings. 2 training iterations on ONE GPU
# through the rollout backend and the DeepSpeed learner, on random weights of the recipe's architecture
# (no download); numbers in $SMOKE_OUT/checklist.json (smoke: losses, log-prob gap, tokens/s, sync
# and sleep seconds, peak GPU memory per phase), the run's metrics and logs in $SMOKE_OUT/logs.tar.gz.
#
#   bash scripts/gpu_smoke.sh                                   # textcraft_grpo_qwen1.5b, vLLM, sleep as probed
#   RECIPE=textcraft_gigpo_qwen1.5b bash scripts/gpu_smoke.sh  # another recipe
#   SMOKE_BACKEND=torch bash scripts/gpu_smoke.sh               # the torch rollout backend instead of vLLM
#   SMOKE_SLEEP_LEVEL=1 bash scripts/gpu_smoke.sh               # vLLM's sleep level (default: what probe_sleep found)
#   bash scripts/gpu_smoke.sh env.group_size=8                  # key=value overrides of the run go last
#   SMOKE_BACKEND=torch RECIPE=textcraft_bipace_qwen7b bash scripts/gpu_smoke.sh model.lora_rank=64 \
#       model.lora_alpha=128 learner.zero_stage=2               # the 7B shape on one GPU: LoRA, 44 GB
#
# Environment: AGENTRL_PYTHON (default python3: the interpreter with torch; vLLM, DeepSpeed and Ray may be
# on PYTHONPATH), SMOKE_OUT (default /tmp/agentrl-gpu-smoke), SMOKE_KEEP_CHECKPOINT=1 writes the final
# checkpoint and final model (~21 GB at 1.5B) into the run directory ($TMPDIR/agentrl-checklist-work/runs/smoke).
# The smoke runs 4 steps per episode (the script defaulted to 8 and to ALFWorld before 2026-11-29:
# add env.max_steps=8 to repeat those runs).
set -euo pipefail
PY=${AGENTRL_PYTHON:-python3}
STAGES=imports,probe_ray,probe_ipc,probe_sleep,smoke
[ "${SMOKE_BACKEND:-vllm}" = torch ] && STAGES=imports,probe_ray,probe_ipc,smoke
ARGS=(--stages "$STAGES" --smoke-backend "${SMOKE_BACKEND:-vllm}" --sleep-level "${SMOKE_SLEEP_LEVEL:-auto}")
if [ -n "${RECIPE:-}" ]; then ARGS+=(--smoke-recipe "$RECIPE"); fi
if [ "${SMOKE_KEEP_CHECKPOINT:-0}" = 1 ]; then ARGS+=(--final-checkpoint); fi
exec bash "$(dirname "$0")/gpu_checklist.sh" "$PY" "${SMOKE_OUT:-/tmp/agentrl-gpu-smoke}" "${ARGS[@]}" "$@"
