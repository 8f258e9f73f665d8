#!/usr/bin/env bash
# Builds hermes-confine.so (exec_confine.c) at $1: system calls only, no libc linked (x86-64, arm64).
# Used by scripts/setup.sh; verify.py ships the library to each verifying command (see exec_confine.c).
set -euo pipefail
src="$(dirname "$0")/exec_confine.c"
out=${1:?usage: build_exec_confine.sh OUTPUT [CC-FLAG...]}
shift
cc -O2 -Wall -fPIC -shared -nostdlib -ffreestanding -fno-stack-protector -Wl,-z,now -s "$@" -o "$out" "$src"
