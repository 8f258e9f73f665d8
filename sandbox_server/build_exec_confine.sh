#!/usr/bin/env bash
# Builds hermes-confine.so (exec_confine.c) at $1: system calls only, no libc linked (x86-64, arm64).
# Used by scripts/setup.sh (sandbox_server/hermes-confine.so) and scripts/build_sandbox_runtime.sh; the sandbox
# server binds it read-only into every slot command's namespace (see exec_confine.c).
set -euo pipefail
src="$(dirname "$0")/exec_confine.c"
out=${1:?usage: build_exec_confine.sh OUTPUT [CC-FLAG...]}
shift
# No loop turned into a memcpy/memset call (nothing but the two symbols named in exec_confine.c is imported).
cc -O2 -Wall -fPIC -shared -nostdlib -ffreestanding -fno-stack-protector -fno-tree-loop-distribute-patterns \
  -Wl,-z,now -Wl,-e,hermes_trampoline -s "$@" -o "$out" "$src"
