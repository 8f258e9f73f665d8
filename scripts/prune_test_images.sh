#!/usr/bin/env bash
# Bounds the disk the test suite's image cache takes. The suite tags what it builds by content, so
# every change to the runtime, a fixture or a CA bundle leaves a new tag beside the old ones; on a
# machine that runs the suite many times they add up to tens of GB (a full disk once crashed mypy's
# cache in CI). Kept: the newest $KEEP tags of each test repository (the current ones, rebuilt from
# cache otherwise). Removed: older tags, and untagged layers no image uses.
#
#   bash scripts/prune_test_images.sh           # keep 2 tags per test repository
#   KEEP=1 bash scripts/prune_test_images.sh
#
# Only repositories named hermes-rl-test* / hermes-rl-tests* are touched; base images, the TB2 table's
# images and anything else on the engine stay.
set -euo pipefail
keep=${KEEP:-2}
docker info >/dev/null 2>&1 || { echo "[prune] no Docker engine answers: start it with scripts/start_docker.sh" >&2; exit 2; }
# One line per tag, newest first within a repository: "<created>\t<repo>\t<repo:tag>".
listing=$(docker images --format '{{.CreatedAt}}\t{{.Repository}}\t{{.Repository}}:{{.Tag}}' \
  | awk -F'\t' '$2 ~ /^hermes-rl-tests?([-\/]|$)/ && $3 !~ /:<none>$/' | sort -t$'\t' -k2,2 -k1,1r)
old=$(printf '%s\n' "$listing" | awk -F'\t' -v keep="$keep" 'NF { if (++n[$2] > keep) print $3 }')
if [ -n "$old" ]; then
  count=$(printf '%s\n' "$old" | wc -l)
  echo "[prune] removing $count stale test image tag(s) (keeping the newest $keep per repository)"
  # An image a container still uses is refused; that is fine, the next run removes it.
  printf '%s\n' "$old" | xargs -r docker rmi >/dev/null 2>&1 || true
fi
docker image prune -f >/dev/null
