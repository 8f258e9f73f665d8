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

# python:3.13-slim-bookworm  Stand-in for the official image (most Terminal-Bench 2 Dockerfiles start FROM it):
# debian:bookworm + the libraries the official slim image carries + this host's own CPython 3.13 (pyenv,
# built on Debian 12 with the same glibc), at its build prefix (its rpath) and linked from /usr/local/bin as
# the official image's python3.13/python3/python/pip3/pip. Skipped where the host has no such interpreter.
make_python_image() {  # tag pyenv-dir
  local tag=$1 src=$2
  if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "[base-images] $tag present"; return
  fi
  [ -x "$src/bin/python3" ] || { echo "[base-images] $tag skipped: no interpreter at $src"; return; }
  local ctx ver
  ctx=$(mktemp -d /var/tmp/hermes-pyimage.XXXXXX)
  ver=$("$src/bin/python3" -c 'import platform; print(platform.python_version())')
  # The host's own site hooks (its proxy's CA .pth) stay out: only pip comes along.
  tar -C "$src" --exclude='lib/python*/site-packages/*.pth' --exclude='__pycache__' -cf "$ctx/python.tar" .
  cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM debian:bookworm
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
    ca-certificates netbase tzdata libssl3 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 zlib1g libreadline8 \\
    libncursesw6 libgdbm6 libuuid1 libexpat1 && rm -rf /var/lib/apt/lists/*
ADD python.tar $src/
RUN for n in python${ver%.*} python3 python pip3 pip; do t=$src/bin/\$n; [ -e \$t ] || t=$src/bin/python3; \\
      [ \$n = python ] && t=$src/bin/python3; [ \$n = pip ] && t=$src/bin/pip3; ln -sf \$t /usr/local/bin/\$n; done
ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 PYTHON_VERSION=$ver
LABEL hermes-rl.base-image=1 hermes-rl.stand-in="CPython $ver of the host (pyenv) on debian:bookworm"
CMD ["python3"]
DOCKERFILE
  DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "[base-images] made $tag (stand-in: CPython $ver)"
}
make_python_image python:3.13-slim-bookworm "${HERMES_PYENV_ROOT:-/root/.pyenv}/versions/3.13.0"
