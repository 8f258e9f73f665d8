#!/usr/bin/env bash
# Starts a Docker engine when none answers (machines here have no systemd), and waits for it.
# Its log goes to /var/log/dockerd.log (or $TMPDIR when that is not writable).
set -euo pipefail
docker info >/dev/null 2>&1 && exit 0
command -v dockerd >/dev/null || { echo "[docker] dockerd missing: run scripts/setup.sh" >&2; exit 2; }
log=/var/log/dockerd.log
touch "$log" 2>/dev/null || log=${TMPDIR:-/tmp}/dockerd.log
echo "[docker] starting dockerd (log: $log)"
nohup dockerd >>"$log" 2>&1 </dev/null &
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "[docker] dockerd did not answer within 30 s; its log ends with:" >&2
tail -20 "$log" >&2
exit 1
