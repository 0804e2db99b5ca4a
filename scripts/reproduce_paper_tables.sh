#!/usr/bin/env bash
# The papers' tables at full scale (GPU): ALFWorld, WebShop and TextCraft x GRPO, GiGPO, GAGPO,
# BiPACE x 3 seeds with the Qwen2.5-1.5B and 7B paper recipes (sweeps/paper_qwen1.5b.yaml,
# sweeps/paper_qwen7b.yaml), each run evaluated after training, then the tables (Markdown,
# LaTeX, CSV) and the learning curves into docs/results/.
#
#   scripts/reproduce_paper_tables.sh            # both model sizes
#   SIZES=1.5b scripts/reproduce_paper_tables.sh # one of them
#
# A 1.5B cell needs 4 GPUs, a 7B cell 8 (the sweep files' gpus_per_cell); cells run side by side
# when the node has more. Resumable: run it again after a kill or a failure. Extra arguments go
# to `agentrl sweep` (e.g. --concurrency 1, --dry-run).
set -uo pipefail
cd "$(dirname "$0")/.."
AGENTRL=${AGENTRL:-agentrl}
SIZES=${SIZES:-"1.5b 7b"}
RESULTS=${RESULTS:-docs/results}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "reproduce_paper_tables.sh needs NVIDIA GPUs; on CPU run scripts/reproduce_mini.sh" >&2
    exit 2
fi

status=0
mkdir -p "$RESULTS"
for size in $SIZES; do
    sweep="sweeps/paper_qwen${size}.yaml"
    out="runs/sweeps/paper_qwen${size}"
    $AGENTRL sweep sweep="$sweep" out="$out" "$@" || status=1
    for arg in "$@"; do [ "$arg" = "--dry-run" ] && continue 2; done
    $AGENTRL table results="$out" --format md out="$RESULTS/paper_qwen${size}.md" plots="$RESULTS" || status=1
    $AGENTRL table results="$out" --format latex out="$RESULTS/paper_qwen${size}.tex" --no-plots || status=1
    $AGENTRL table results="$out" --format csv out="$RESULTS/paper_qwen${size}.csv" --no-plots || status=1
    # BiPACE reports the peak validation success over training: the same runs read that way
    $AGENTRL table results="$out" metric=peak --format md out="$RESULTS/paper_qwen${size}_peak.md" --no-plots || status=1
done
exit $status
