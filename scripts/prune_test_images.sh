#!/usr/bin/env bash
# Bounds the disk the test suite's image cache takes. The suite tags what it builds by content, so
# every change to the runtime, a fixture or a CA bundle leaves a new tag beside the old ones; on a
# machine that runs the suite many times they add up to tens of GB (a full disk once crashed mypy's
# cache in CI). Kept: the newest tags of each test repository (the current ones; the rest would be
# rebuilt from cache). Removed: older tags, with the layers only they used (`docker rmi`). Dangling
# images are left alone: a build running beside this one has some.
#
#   bash scripts/prune_test_images.sh                      # keep 2 tags per hermes-rl-test* repository
#   bash scripts/prune_test_images.sh --keep 1 --prefix hermes-rl-test-endless
#
# Only repositories whose name starts with the prefix (default hermes-rl-test, which covers
# hermes-rl-tests too) are touched: base images, the TB2 table's images and the rest stay.
set -euo pipefail
keep=2 prefix=hermes-rl-test
while [ $# -gt 0 ]; do
  case $1 in
    --keep) keep=${2:?--keep needs a number}; shift 2 ;;
    --prefix) prefix=${2:?--prefix needs a repository prefix}; shift 2 ;;
    *) echo "[prune] unknown argument $1 (use --keep N, --prefix P)" >&2; exit 2 ;;
  esac
done
case $keep in '' | *[!0-9]*) echo "[prune] --keep must be a whole number, not $keep" >&2; exit 2 ;; esac
docker info >/dev/null 2>&1 || { echo "[prune] no Docker engine answers: start it with scripts/start_docker.sh" >&2; exit 2; }
# One line per tag, newest first within a repository: "<created>\t<repo>\t<repo:tag>".
listing=$(docker images --format '{{.CreatedAt}}\t{{.Repository}}\t{{.Repository}}:{{.Tag}}' \
  | awk -F'\t' -v p="$prefix" 'index($2, p) == 1 && $3 !~ /:<none>$/' | sort -t$'\t' -k2,2 -k1,1r)
old=$(printf '%s\n' "$listing" | awk -F'\t' -v keep="$keep" 'NF { if (++n[$2] > keep) print $3 }')
if [ -n "$old" ]; then
  echo "[prune] removing $(printf '%s\n' "$old" | wc -l) stale image tag(s) of $prefix* (keeping the newest $keep per repository)"
  # An image a container still uses is refused; the next run removes it.
  printf '%s\n' "$old" | xargs -r docker rmi >/dev/null 2>&1 || true
fi
