#!/usr/bin/env bash
# GPU smoke run: 2 training iterations of a 1.5B recipe on ONE GPU, through the vLLM rollout
# backend and the DeepSpeed ZeRO learner, on a randomly initialised model with the Qwen2.5-1.5B
# architecture (model.random_init=true: no weights are downloaded). Prints rollout tokens/s,
# learner tokens/s, iteration time and the rollout/learner log-prob gap from the run's
# metrics.jsonl (scripts/smoke_report.py).
#
#   bash scripts/gpu_smoke.sh                                  # defaults below
#   RECIPE=alfworld_gigpo_qwen1.5b bash scripts/gpu_smoke.sh   # another 1.5B recipe (textcraft_* too)
#   SMOKE_BACKEND=torch bash scripts/gpu_smoke.sh              # the torch rollout backend instead of vLLM
#   SMOKE_SLEEP_LEVEL=2 bash scripts/gpu_smoke.sh              # vLLM drops its weights during the learner's
#                                                              # passes (default 1: kept in host memory; 0: never sleeps)
#   bash scripts/gpu_smoke.sh env.group_size=8                 # extra key=value overrides go last
#   SMOKE_BACKEND=torch RECIPE=textcraft_bipace_qwen7b bash scripts/gpu_smoke.sh model.lora_rank=64 \
#       model.lora_alpha=128 learner.zero_stage=2                # the 7B shape on one GPU: LoRA, 44 GB
#
# Needs a venv with a CUDA torch, vllm (unless SMOKE_BACKEND=torch) and, for ALFWorld recipes, alfworld:
#   AGENTRL_TORCH=torch AGENTRL_EXTRAS=dev,alfworld,vllm bash scripts/setup.sh
# (the docker/Dockerfile image has them). The first ALFWorld use generates the game set
# (~/.cache/agentrl/alfworld, or $ALFWORLD_DATA when it holds the official data).
# Environment: AGENTRL_PYTHON (default .venv/bin/python), SMOKE_OUT (default /tmp/agentrl-gpu-smoke),
# SMOKE_KEEP_CHECKPOINT=1 keeps the final checkpoint (about 20 GB for 1.5B with optimizer state).
# HF_HUB_OFFLINE defaults to 1: the Qwen tokenizer is used when it is in the Hugging Face cache,
# otherwise the run trains a tokenizer on ALFWorld text (the model keeps the Qwen vocabulary size).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${AGENTRL_PYTHON:-.venv/bin/python}
RECIPE=${RECIPE:-alfworld_bipace_qwen1.5b}
BACKEND=${SMOKE_BACKEND:-vllm}
SLEEP_LEVEL=${SMOKE_SLEEP_LEVEL:-1}
OUT=${SMOKE_OUT:-/tmp/agentrl-gpu-smoke}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} RAY_USAGE_STATS_ENABLED=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "[gpu-smoke] no CUDA device visible to $PY" >&2; exit 1; }
case "$BACKEND" in
  vllm) "$PY" -c "import vllm" 2>/dev/null \
    || { echo "[gpu-smoke] vllm does not import in $PY; run AGENTRL_TORCH=torch AGENTRL_EXTRAS=dev,alfworld,vllm bash scripts/setup.sh, or set SMOKE_BACKEND=torch" >&2; exit 1; } ;;
  torch) ;;
  *) echo "[gpu-smoke] SMOKE_BACKEND=$BACKEND: use vllm or torch" >&2; exit 1 ;;
esac
if [[ "$RECIPE" == alfworld_* ]]; then
  "$PY" -c "import alfworld" 2>/dev/null \
    || { echo "[gpu-smoke] alfworld does not import in $PY; install agentrl with the alfworld extra" >&2; exit 1; }
fi

# One GPU holds both the learner (in the driver process) and one vLLM engine (the colocated
# placement layout), so the recipe's 2 learner ranks and tensor parallelism 2 become 1 and 1, and
# vLLM takes 30 % of the memory.
# Small batches keep the two iterations short; the vocabulary-sized logits of a micro-batch are
# what limits learner.micro_batch_size on one GPU.
ARGS=(
  model.random_init=true
  trainer.device=cuda
  trainer.iterations=2
  trainer.resume=never
  trainer.eval_every=0
  trainer.eval_before_train=false
  trainer.save_every=0
  env.tasks_per_iteration=4
  env.group_size=4
  env.max_steps=8
  env.num_servers=4
  "rollout.backend=$BACKEND"
  rollout.num_workers=1
  rollout.max_response_tokens=128
  rollout.prompt_truncation=left
  rollout.vllm.tensor_parallel_size=1
  rollout.vllm.gpu_memory_utilization=0.3
  "rollout.vllm.sleep_level=$SLEEP_LEVEL"
  learner.num_ranks=1
  placement.layout=colocated
  learner.mini_batch_size=64
  learner.micro_batch_size=4
  logging.wandb.mode=disabled
  logging.tensorboard=false
)

rm -rf "$OUT/smoke"
echo "[gpu-smoke] $RECIPE, $BACKEND rollout backend, random weights of the recipe's architecture, run dir $OUT/smoke"
start=$(date +%s)
"$PY" -m agentrl.cli.main train "recipe=$RECIPE" "${ARGS[@]}" "trainer.output_dir=$OUT" trainer.run_name=smoke "$@"
echo "[gpu-smoke] train finished in $(( $(date +%s) - start )) s (model build, engine start-up and checkpoint included)"
"$PY" scripts/smoke_report.py "$OUT/smoke" --expect-iterations 2
if [ "${SMOKE_KEEP_CHECKPOINT:-0}" != "1" ]; then
  rm -rf "$OUT/smoke/checkpoints"
fi
