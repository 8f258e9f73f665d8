#!/usr/bin/env bash
# Builds hermes-spawn (spawn_helper.c) at $1: freestanding and static where it can (x86-64, arm64),
# else static against libc, else dynamic. Used by scripts/setup.sh and the Dockerfile.
set -euo pipefail
src="$(dirname "$0")/spawn_helper.c"
out=${1:?usage: build_spawn_helper.sh OUTPUT}
cc -O2 -Wall -static -nostdlib -ffreestanding -fno-stack-protector -DHERMES_FREESTANDING -o "$out" "$src" 2>/dev/null \
  || cc -O2 -Wall -static -o "$out" "$src" \
  || cc -O2 -Wall -o "$out" "$src"
