#!/usr/bin/env bash
# Test-only stand-in for a registry: base images made offline with debootstrap + `docker import`,
# tagged with the names our fixtures' FROM lines use. No registry is reachable from these machines.
#
#   bash scripts/base_images.sh            # make what is missing
#   bash scripts/base_images.sh --force    # make all again
#   bash scripts/base_images.sh --tb2      # also the other bases the 89 published Terminal-Bench 2 tasks name
#                                          # (opt-in: only scripts/tb2_table.py needs them; --force may follow)
#
# debian:bookworm  Debian 12 minbase (no python)
# ubuntu:22.04     Ubuntu jammy minbase (no python; apt gives python3.10, as in Ubuntu's own image)
# Each image carries the label hermes-rl.base-image=1 so tests can tell a stand-in from a real pull.
set -euo pipefail
force=0 tb2=0
for arg in "$@"; do
  case $arg in
    --force) force=1 ;;
    --tb2) tb2=1 ;;
    *) echo "[base-images] unknown argument $arg (use --force, --tb2)" >&2; exit 2 ;;
  esac
done
command -v debootstrap >/dev/null || { echo "[base-images] debootstrap missing: run scripts/setup.sh" >&2; exit 2; }
docker info >/dev/null 2>&1 || { echo "[base-images] no Docker engine answers: start dockerd (see .ci/run)" >&2; exit 2; }

# The --tb2 images: apt sources as the official image has them (updates and security pockets, every
# component), and Ubuntu's user ubuntu (uid 1000, in its images since 23.04). The CI's two stay as they were.
official_sources() {  # suite root
  local suite=$1 root=$2
  case $suite in
    noble)
      rm -f "$root/etc/apt/sources.list"
      printf 'Types: deb\nURIs: http://archive.ubuntu.com/ubuntu/\nSuites: %s %s-updates %s-backports\nComponents: main universe restricted multiverse\nSigned-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n\nTypes: deb\nURIs: http://security.ubuntu.com/ubuntu/\nSuites: %s-security\nComponents: main universe restricted multiverse\nSigned-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n' \
        "$suite" "$suite" "$suite" "$suite" >"$root/etc/apt/sources.list.d/ubuntu.sources"
      chroot "$root" useradd -m -u 1000 -U -s /bin/bash -c Ubuntu ubuntu ;;
    trixie)
      rm -f "$root/etc/apt/sources.list"
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\nSuites: %s-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$suite" "$suite" "$suite" >"$root/etc/apt/sources.list.d/debian.sources" ;;
    bullseye)
      printf 'deb http://deb.debian.org/debian %s main\ndeb http://deb.debian.org/debian-security %s-security main\ndeb http://deb.debian.org/debian %s-updates main\n' \
        "$suite" "$suite" "$suite" >"$root/etc/apt/sources.list" ;;
  esac
}

make_image() {  # tag suite mirror [extra debootstrap args...] [-- debootstrap script]
  local tag=$1 suite=$2 mirror=$3 script=; shift 3
  local -a extra=()
  while [ $# -gt 0 ]; do
    [ "$1" = -- ] && { script=$2; break; }
    extra+=("$1"); shift
  done
  if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "[base-images] $tag present"; return
  fi
  local root
  root=$(mktemp -d /var/tmp/hermes-rootfs.XXXXXX)
  echo "[base-images] debootstrap $suite -> $tag"
  # shellcheck disable=SC2086 # $script is empty (the suite's own script) or one path
  if ! debootstrap --variant=minbase "${extra[@]}" "$suite" "$root" "$mirror" $script >"$root.log" 2>&1; then
    tail -20 "$root.log" >&2; rm -rf "$root" "$root.log"; exit 1
  fi
  # What an official image has and minbase lacks: apt that does not ask, no docs, a clean cache.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  official_sources "$suite" "$root"
  tar -C "$root" -c . | docker import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'LABEL hermes-rl.base-image=1' \
    --change "LABEL hermes-rl.stand-in=\"debootstrap --variant=minbase $suite\"" \
    - "$tag" >/dev/null
  rm -rf "$root" "$root.log"
  case $suite in noble | trixie | bullseye) upgraded "$tag" ;; esac
  echo "[base-images] made $tag"
}

# An official image is remade with every update: its packages are the -updates/-security ones. debootstrap
# gives the release's, which an `apt-get install` would upgrade (a change to a library of the image).
upgraded() {  # tag
  local ctx
  ctx=$(mktemp -d /var/tmp/hermes-upgrade.XXXXXX)
  printf 'FROM %s\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get -y dist-upgrade && apt-get clean && rm -rf /var/lib/apt/lists/*\n' \
    "$1" >"$ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$1" "$ctx" >/dev/null
  rm -rf "$ctx"
}

make_image debian:bookworm bookworm http://deb.debian.org/debian &
make_image ubuntu:22.04 jammy http://archive.ubuntu.com/ubuntu --no-check-gpg --components=main,universe &
wait -n && wait -n

# python:3.13-slim-bookworm  Stand-in for the official image (most Terminal-Bench 2 Dockerfiles start FROM it):
# debian:bookworm + the libraries the official slim image carries + this host's own CPython 3.13 (pyenv,
# built on Debian 12 with the same glibc), at its build prefix (its rpath) and linked from /usr/local/bin as
# the official image's python3.13/python3/python/pip3/pip. Skipped where the host has no such interpreter.
make_python_image() {  # tag pyenv-dir [base [extra apt packages]]
  local tag=$1 src=$2 base=${3:-debian:bookworm} extra=${4:-}
  # Layout 2: pip's scripts on PATH, only pip/setuptools/wheel of the host's packages (older ones are remade).
  if [ "$force" = 0 ] && [ "$(docker image inspect -f '{{index .Config.Labels "hermes-rl.stand-in-layout"}}' "$tag" 2>/dev/null)" = 2 ]; then
    echo "[base-images] $tag present"; return
  fi
  [ -x "$src/bin/python3" ] || { echo "[base-images] $tag skipped: no interpreter at $src"; return; }
  local ctx ver
  ctx=$(mktemp -d /var/tmp/hermes-pyimage.XXXXXX)
  ver=$("$src/bin/python3" -c 'import platform; print(platform.python_version())')
  # What the official image's site-packages holds (pip; setuptools and wheel before 3.12), nothing else of
  # the host's: not its packages, not its own site hooks (its proxy's CA .pth).
  local site=lib/python${ver%.*}/site-packages
  tar -C "$src" --exclude="./$site/*" --exclude='./bin/*' --exclude='__pycache__' -cf "$ctx/python.tar" .
  (cd "$src" && for p in ./$site/{pip,setuptools,wheel}{,-*} ./$site/{_distutils_hack,pkg_resources,distutils-precedence.pth} \
    ./bin/{python,pip,idle,pydoc,2to3}*; do if [ -e "$p" ]; then echo "$p"; fi; done) |
    tar -C "$src" --exclude='__pycache__' -rf "$ctx/python.tar" -T -
  cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM $base
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
    ca-certificates netbase tzdata libssl3 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 zlib1g libreadline8 \\
    libncursesw6 libgdbm6 libuuid1 libexpat1 $extra && rm -rf /var/lib/apt/lists/*
ADD python.tar $src/
# Its programs in /usr/local/bin, as the official image's, and its bin/ a link there: what pip installs
# (pytest, ...) lands on every PATH, a login shell's too.
RUN mv $src/bin/* /usr/local/bin/ && rmdir $src/bin && ln -s /usr/local/bin $src/bin && \\
    for n in python3 python pip3 pip; do [ -e /usr/local/bin/\$n ] || ln -s python${ver%.*} /usr/local/bin/\$n; done
ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 PYTHON_VERSION=$ver
LABEL hermes-rl.base-image=1 hermes-rl.stand-in="CPython $ver of the host (pyenv) on $base${extra:+ with $extra}" \\
      hermes-rl.stand-in-layout=2
CMD ["python3"]
DOCKERFILE
  DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "[base-images] made $tag (stand-in: CPython $ver on $base)"
}
pyenv=${HERMES_PYENV_ROOT:-/root/.pyenv}/versions
make_python_image python:3.13-slim-bookworm "$pyenv/3.13.0"
[ "$tb2" = 1 ] || exit 0

# --tb2: every other FROM of the published Terminal-Bench 2 tasks, each a stand-in (label hermes-rl.stand-in)
# that differs from the official image where its line says so. bookworm's debootstrap has no noble script:
# gutsy's is the one Ubuntu's own debootstrap links noble to (zstd .debs need zstd on the host).
make_image ubuntu:24.04 noble http://archive.ubuntu.com/ubuntu --no-check-gpg --components=main,universe \
  -- /usr/share/debootstrap/scripts/gutsy &
make_image debian:bullseye-slim bullseye http://deb.debian.org/debian &
wait -n && wait -n
make_image debian:13.0-slim trixie http://deb.debian.org/debian --no-check-gpg
# The official python:3.11-slim and python:3.11 are Debian 13 (trixie) now; these are bookworm, like
# the host's pyenv builds (same glibc and libssl3). python:3.11 (buildpack-deps) adds compilers, git,
# curl and the common -dev packages: here the ones below, not the full set.
make_python_image python:3.10-slim-bookworm "$pyenv/3.10.13"
make_python_image python:3.11-slim "$pyenv/3.11.7"
make_python_image python:3.11 "$pyenv/3.11.7" debian:bookworm \
  "build-essential git curl wget procps openssh-client unzip xz-utils bzip2 libssl-dev libffi-dev zlib1g-dev"

# ghcr.io/astral-sh/uv:<v> (three Dockerfiles `COPY --from=` it): the official image is FROM scratch with
# /uv and /uvx; here the same two binaries from uv's PyPI wheel (pip through the host's proxy).
make_uv_image() {  # version
  local tag=ghcr.io/astral-sh/uv:$1 ctx
  if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "[base-images] $tag present"; return
  fi
  ctx=$(mktemp -d /var/tmp/hermes-uvimage.XXXXXX)
  python3 -m pip download -q "uv==$1" --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d "$ctx"
  python3 -m zipfile -e "$ctx"/uv-*.whl "$ctx/whl"
  cp "$ctx/whl/uv-$1.data/scripts/uv" "$ctx/whl/uv-$1.data/scripts/uvx" "$ctx/"
  chmod 755 "$ctx/uv" "$ctx/uvx"
  printf 'FROM scratch\nCOPY uv uvx /\nLABEL hermes-rl.base-image=1 hermes-rl.stand-in="uv %s from its PyPI wheel"\nENTRYPOINT ["/uv"]\n' "$1" >"$ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "[base-images] made $tag (stand-in: uv $1 from its wheel)"
}
make_uv_image 0.8.14
make_uv_image 0.8.15
