#!/usr/bin/env bash
# CPU reproduction in miniature: GRPO, GiGPO, GAGPO and BiPACE x 3 seeds on the tiny TextCraft
# recipes (sweeps/mini_textcraft.yaml), then the table and the learning curves into docs/results/.
#
#   OMP_NUM_THREADS=2 scripts/reproduce_mini.sh  # one cell at a time, both cores: 82 min on a 2-core Xeon
#   scripts/reproduce_mini.sh                 # one torch thread per cell (the default below)
#   scripts/reproduce_mini.sh --concurrency 2 # more cells at once on a bigger machine
#
# Resumable: killing it and running it again skips the finished cells and continues the others
# from their newest checkpoint. The table is written even when some cells failed (they are listed
# at the end of the sweep's output and in <out>/manifest.json); the exit status is then 1.
set -uo pipefail
cd "$(dirname "$0")/.."
AGENTRL=${AGENTRL:-agentrl}
OUT=${OUT:-runs/sweeps/mini_textcraft}
RESULTS=${RESULTS:-docs/results}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

$AGENTRL sweep sweep=sweeps/mini_textcraft.yaml out="$OUT" "$@"
status=$?
for arg in "$@"; do [[ $arg == --dry-run ]] && exit $status; done

mkdir -p "$RESULTS"
$AGENTRL table results="$OUT" --format md out="$RESULTS/mini_textcraft.md" plots="$RESULTS" || exit $?
$AGENTRL table results="$OUT" --format csv out="$RESULTS/mini_textcraft.csv" --no-plots || exit $?
echo "table: $RESULTS/mini_textcraft.md, $RESULTS/mini_textcraft.csv; curves: $RESULTS/curve_textcraft_tiny.png"
exit $status
