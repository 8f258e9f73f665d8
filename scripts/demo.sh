#!/usr/bin/env bash
# Set up what it needs (scripts/setup_core.sh; the tests' extras, container engines and torch are
# scripts/setup.sh's), then run the main job: the GSM8k agent env's `process` command on the
# embedded llama.cpp model (no API key, no network). Extra arguments go to `process`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_core.sh
exec .venv/bin/python -m environments.gsm8k_agent_env process "$@"
