#!/usr/bin/env bash
# Set everything up, lint and type-check, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The container tests need a running engine and the offline base images (made once, then cached).
bash scripts/start_docker.sh
bash scripts/base_images.sh
# Old content-tagged test images pile up run after run; a full disk once broke CI (mypy's cache).
bash scripts/prune_test_images.sh
free_gb=$(( $(df -Pk . | awk 'NR==2 {print $4}') / 1048576 ))
[ "$free_gb" -ge 6 ] || echo "[test] warning: only ${free_gb} GB free here; the suite builds images and venvs (~6 GB)" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # files and settings: [tool.mypy] in pyproject.toml
# Two workers: half the suite waits on sandboxes, timeouts and child processes, one core each.
# --maxschedchunk 1: a worker takes the next test when it is free (tests/conftest.py puts the long
# files first), so the long tests spread over both workers. Serial instead: append -n 0.
exec .venv/bin/python -m pytest -n 2 --maxschedchunk 1 "$@"
