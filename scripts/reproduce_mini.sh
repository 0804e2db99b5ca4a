#!/usr/bin/env bash
# CPU reproduction in miniature: GRPO, GiGPO, GAGPO and BiPACE x 3 seeds on the tiny TextCraft
# recipes (sweeps/mini_textcraft.yaml), then the table and the learning curves into docs/results/.
#
#   scripts/reproduce_mini.sh                  # one cell at a time on every core: 82 min on a 2-core Xeon
#   scripts/reproduce_mini.sh --concurrency 2  # two cells at once, half the cores each
#   OMP_NUM_THREADS=1 scripts/reproduce_mini.sh  # a thread count of your own wins over the default
#
# Resumable: killing it and running it again skips the finished cells and continues the others
# from their newest checkpoint. The table is written even when some cells failed (they are listed
# at the end of the sweep's output and in <out>/manifest.json); the exit status is then 1.
set -uo pipefail
cd "$(dirname "$0")/.."
AGENTRL=${AGENTRL:-agentrl}
OUT=${OUT:-runs/sweeps/mini_textcraft}
RESULTS=${RESULTS:-docs/results}

# Torch threads per cell, unless set: the cores this process may use, divided among the cells that
# run at once (`--concurrency N`; the sweep file's default is one cell at a time on CPU).
concurrency=1 previous=""
for arg in "$@"; do
    [[ $previous == --concurrency ]] && concurrency=$arg
    [[ $arg == --concurrency=* ]] && concurrency=${arg#--concurrency=}
    previous=$arg
done
if ! [[ $concurrency =~ ^[1-9][0-9]*$ ]]; then
    echo "reproduce_mini.sh: --concurrency must be a whole number >= 1, got '$concurrency'" >&2
    exit 2
fi
threads=$(( $(nproc) / concurrency ))
(( threads < 1 )) && threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
echo "reproduce_mini.sh: OMP_NUM_THREADS=$OMP_NUM_THREADS for each of the $concurrency cell(s) at once" >&2

$AGENTRL sweep sweep=sweeps/mini_textcraft.yaml out="$OUT" "$@"
status=$?
for arg in "$@"; do [[ $arg == --dry-run ]] && exit $status; done

mkdir -p "$RESULTS"
$AGENTRL table results="$OUT" --format md out="$RESULTS/mini_textcraft.md" plots="$RESULTS" || exit $?
$AGENTRL table results="$OUT" --format csv out="$RESULTS/mini_textcraft.csv" --no-plots || exit $?
echo "table: $RESULTS/mini_textcraft.md, $RESULTS/mini_textcraft.csv; curves: $RESULTS/curve_textcraft_tiny.png"
exit $status
