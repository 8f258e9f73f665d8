#!/usr/bin/env bash
# Set everything up, lint and type-check, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Files held to `ruff format`; the rest of the tree joins once the parallel branches have landed.
FORMATTED=(environments/runtime.py environments/examples environments/gsm8k environments/models/__init__.py
           tests/test_example_env.py tests/batch/test_batch_runtime.py)
.venv/bin/ruff check .
.venv/bin/ruff format --check "${FORMATTED[@]}"
.venv/bin/mypy  # files and settings: [tool.mypy] in pyproject.toml
exec .venv/bin/python -m pytest "$@"
