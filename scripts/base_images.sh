#!/usr/bin/env bash
# Test-only stand-in for a registry: base images made offline with debootstrap + `docker import`,
# tagged with the names our fixtures' FROM lines use. No registry is reachable from these machines.
#
#   bash scripts/base_images.sh            # make what is missing
#   bash scripts/base_images.sh --force    # make all again
#
# debian:bookworm  Debian 12 minbase (no python)
# ubuntu:22.04     Ubuntu jammy minbase (no python; apt gives python3.10, as in Ubuntu's own image)
# Each image carries the label hermes-rl.base-image=1 so tests can tell a stand-in from a real pull.
set -euo pipefail
force=0
[ "${1:-}" = --force ] && force=1
command -v debootstrap >/dev/null || { echo "[base-images] debootstrap missing: run scripts/setup.sh" >&2; exit 2; }
docker info >/dev/null 2>&1 || { echo "[base-images] no Docker engine answers: start dockerd (see .ci/run)" >&2; exit 2; }

make_image() {  # tag suite mirror [extra debootstrap args...]
  local tag=$1 suite=$2 mirror=$3; shift 3
  if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "[base-images] $tag present"; return
  fi
  local root
  root=$(mktemp -d /var/tmp/hermes-rootfs.XXXXXX)
  echo "[base-images] debootstrap $suite -> $tag"
  if ! debootstrap --variant=minbase "$@" "$suite" "$root" "$mirror" >"$root.log" 2>&1; then
    tail -20 "$root.log" >&2; rm -rf "$root" "$root.log"; exit 1
  fi
  # What an official image has and minbase lacks: apt that does not ask, no docs, a clean cache.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'LABEL hermes-rl.base-image=1' \
    - "$tag" >/dev/null
  rm -rf "$root" "$root.log"
  echo "[base-images] made $tag"
}

make_image debian:bookworm bookworm http://deb.debian.org/debian &
make_image ubuntu:22.04 jammy http://archive.ubuntu.com/ubuntu --no-check-gpg --components=main,universe &
wait -n && wait -n
