#!/usr/bin/env bash
# Builds hermes-spawn (spawn_helper.c, with the slot exec server of exec_server.c and the task containers' pid 1
# of task_init.c) at $1: freestanding and static where it can (x86-64, arm64), else static against libc, else
# dynamic. Used by scripts/setup_core.sh and scripts/build_sandbox_runtime.sh.
set -euo pipefail
dir="$(dirname "$0")"
src=("$dir/spawn_helper.c" "$dir/exec_server.c" "$dir/task_init.c")
out=${1:?usage: build_spawn_helper.sh OUTPUT}
cc -O2 -Wall -static -nostdlib -ffreestanding -fno-stack-protector -DHERMES_FREESTANDING -o "$out" "${src[@]}" 2>/dev/null \
  || cc -O2 -Wall -static -o "$out" "${src[@]}" \
  || cc -O2 -Wall -o "$out" "${src[@]}"
