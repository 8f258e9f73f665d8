"""When the process running the env dies (SIGTERM or SIGKILL), no sandbox_server or bwrap process survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PARENT = """
import asyncio, sys
from tests.security.conftest import sandbox_backend
from pathlib import Path

async def main(root, marker):
    backend = sandbox_backend(Path(root), slots=2)
    await backend.start()
    async with backend.trajectory("t") as ex:
        task = asyncio.create_task(ex.exec(f"bash -c 'sleep 900; :' {marker}", timeout=600, max_output_bytes=100))
        await asyncio.sleep(1.5)
        print("ready", flush=True)
        await task

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _matching(text: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_no_sandbox_process_outlives_its_parent(tmp_path, sig):
    marker = f"hermes-orphan-{tmp_path.name}"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), marker],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": "."},
    )
    try:
        assert parent.stdout.readline().strip() == b"ready"
        assert _matching(marker) and _matching(str(tmp_path / "sb"))  # the command and its server run
        parent.send_signal(sig)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_matching(marker) or _matching(str(tmp_path / "sb"))):
            time.sleep(0.2)
        assert _matching(marker) == []
        assert _matching(str(tmp_path / "sb")) == []  # no sandbox_server (its argv holds its data dir)
        assert list((tmp_path / "sb").iterdir()) == []  # each server removed its data directory
    finally:
        parent.kill()
        parent.wait()
