#!/usr/bin/env bash
# Air-gapped installs: build a wheelhouse on a connected machine for the cluster's Python and
# platform, carry the directory over, install agentrl from it with no network (docs/quickstart.md,
# "Clusters without internet").
#
#   bash scripts/wheelhouse.sh build DIR [options]    # on a machine with internet
#   bash scripts/wheelhouse.sh install DIR [VENV]     # on the cluster: no index, no network
#
# build options:
#   --python-version 3.12                   the cluster's Python (default: this interpreter's)
#   --platform manylinux_2_28_x86_64        the cluster's platform tag (repeatable; default: this machine's)
#   --extras dev,alfworld,vllm              agentrl's extras (default: alfworld,lora)
#   --envs alfworld,webshop,textcraft       the environments of envs/ to include (default: all three)
#   --torch 'torch==2.11.0'                 the torch the cluster should get (default: torch==2.13.0)
#   --requirements FILE                     wheel these requirements instead of agentrl's closure
#
# What build does:
#   1. agentrl's own wheel (pip wheel --no-deps .) and the environments' (envs/<name>), unless
#      --requirements is given;
#   2. resolves the closure here (pip install --dry-run --report) and builds a wheel of every
#      package that the resolver would take from an sdist (DeepSpeed, antlr4-python3-runtime, ...;
#      DS_BUILD_OPS=0: DeepSpeed's CUDA ops are JIT-built on the cluster, its wheel is pure Python);
#   3. `pip download --only-binary=:all:` of the whole closure for the target Python and platform,
#      finding the wheels of 1-2 in DIR.
# install does `pip install --no-index --find-links DIR` (torch first, as scripts/setup.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 DS_BUILD_OPS=0

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
command=$1; dir=$2; shift 2

case "$command" in
build)
  pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  platforms=(); extras="alfworld,lora"; envs="alfworld,webshop,textcraft"; torch_spec="torch==2.13.0"; requirements=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --python-version) pyver=$2; shift 2 ;;
      --platform) platforms+=("$2"); shift 2 ;;
      --extras) extras=$2; shift 2 ;;
      --envs) envs=$2; shift 2 ;;
      --torch) torch_spec=$2; shift 2 ;;
      --requirements) requirements=$2; shift 2 ;;
      *) echo "wheelhouse: unknown option $1" >&2; usage ;;
    esac
  done
  mkdir -p "$dir"
  start=$(date +%s)
  if [ -z "$requirements" ]; then
    echo "[wheelhouse] agentrl's wheel"
    "$PYTHON" -m pip wheel -q --no-deps -w "$dir" .
    targets=("$(ls "$dir"/agentrl-*.whl | head -1)[$extras]" "$torch_spec")
    for env in ${envs//,/ }; do
      "$PYTHON" -m pip wheel -q --no-deps -w "$dir" "envs/$env"
      targets+=("$(ls "$dir"/agentrl_env_"$env"-*.whl | head -1)")
    done
  else
    mapfile -t targets < <(grep -v '^[[:space:]]*\(#\|$\)' "$requirements")
  fi
  echo "[wheelhouse] resolving the closure to find the packages published without wheels"
  "$PYTHON" -m pip install -q --dry-run --ignore-installed --report "$dir/.resolved.json" "${targets[@]}"
  mapfile -t sdists < <("$PYTHON" - "$dir/.resolved.json" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    url = item["download_info"]["url"]
    if url.endswith((".tar.gz", ".zip", ".tar.bz2")) and not url.startswith("file:"):
        print(f"{item['metadata']['name']}=={item['metadata']['version']}")
PY
)
  for spec in "${sdists[@]}"; do
    echo "[wheelhouse] building $spec from its sdist"
    "$PYTHON" -m pip wheel -q --no-deps -w "$dir" "$spec"
  done
  platform_args=()
  if [ ${#platforms[@]} -gt 0 ]; then
    for p in "${platforms[@]}"; do platform_args+=(--platform "$p"); done
  fi
  echo "[wheelhouse] downloading the closure for Python $pyver ${platforms[*]:-(this platform)}"
  "$PYTHON" -m pip download -q -d "$dir" --only-binary=:all: --python-version "$pyver" "${platform_args[@]}" \
    --find-links "$dir" "${targets[@]}"
  rm -f "$dir/.resolved.json"
  count=$(ls "$dir"/*.whl | wc -l)
  echo "[wheelhouse] $count wheels, $(du -sh "$dir" | cut -f1) in $dir, $(( $(date +%s) - start )) s"
  ;;
install)
  venv=${1:-.venv}
  [ -d "$dir" ] || { echo "wheelhouse: $dir is not a directory" >&2; exit 2; }
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --no-index --find-links "$dir")
  if ls "$dir"/torch-*.whl >/dev/null 2>&1; then
    "${pip[@]}" torch
  fi
  if ls "$dir"/agentrl-*.whl >/dev/null 2>&1; then
    extras=${AGENTRL_EXTRAS:-alfworld,lora}
    env_wheels=()
    for wheel in "$dir"/agentrl_env_*.whl; do
      [ -e "$wheel" ] && env_wheels+=("$(basename "$wheel" | cut -d- -f1 | tr _ -)")
    done
    "${pip[@]}" "agentrl[$extras]" "${env_wheels[@]}"
  else
    shift || true
    "${pip[@]}" "$@"
  fi
  echo "[wheelhouse] installed into $venv from $dir (no index)"
  ;;
*) usage ;;
esac
