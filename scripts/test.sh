#!/usr/bin/env bash
# Set everything up, lint and type-check, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # files and settings: [tool.mypy] in pyproject.toml
# Two workers on two cores: a test waits on a model server or a sandbox much of its time. Tests
# sharing a long session fixture carry an xdist_group mark and stay on one worker.
exec .venv/bin/python -m pytest -n auto --maxprocesses 4 --dist loadgroup "$@"
