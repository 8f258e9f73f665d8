"""When the process running the env dies (SIGTERM or SIGKILL), no sandbox_server or bwrap process survives.

On docker the server's parent is the engine: the signal goes to the container (`docker kill --signal`),
and nothing of that sandbox may outlive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from slots.client import SandboxUnavailable
from tests.security.conftest import host_processes, running_sandbox, sandbox_container, sandbox_processes
from tests.support.docker_engine import SandboxPlace, container_state, kill_container

PARENT = """
import asyncio, sys
from tests.security.conftest import sandbox_backend
from pathlib import Path

async def main(root, marker):
    backend = sandbox_backend(Path(root), slots=2)
    await backend.start()
    async with backend.trajectory("t") as ex:
        task = asyncio.create_task(ex.exec(f"bash -c 'sleep 900; :' {marker}", timeout=600, max_output_bytes=100))
        print("ready", flush=True)
        await task

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_no_sandbox_process_outlives_its_parent(sandbox_at, sig):
    if sandbox_at.kind == "local":
        await asyncio.to_thread(_parent_dies_locally, sandbox_at.tmp_path, sig)
    else:
        await _container_is_signalled(sandbox_at, sig)


def _parent_dies_locally(tmp_path: Path, sig: int) -> None:
    marker = f"hermes-orphan-{uuid.uuid4().hex}"  # unique: pgrep sees the whole machine
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), marker],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": "."},
    )
    try:
        assert parent.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 30
        while not host_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert host_processes(marker) and host_processes(str(tmp_path / "sb"))  # the command and its server run
        parent.send_signal(sig)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (host_processes(marker) or host_processes(str(tmp_path / "sb"))):
            time.sleep(0.2)
        assert host_processes(marker) == []
        assert host_processes(str(tmp_path / "sb")) == []  # no sandbox_server (its argv holds its data dir)
        assert list((tmp_path / "sb").iterdir()) == []  # each server removed its data directory
    finally:
        parent.kill()
        parent.wait()


def _in_container(cid: str) -> list[int]:
    """Pids of this machine's processes in the container's cgroup (its engine runs here: tests/support/docker_engine.py)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if cid in (entry / "cgroup").read_text():
                    pids.append(int(entry.name))
    return pids


async def _container_is_signalled(place: SandboxPlace, sig: int) -> None:
    marker = f"hermes-orphan-{place.test_id}"
    async with running_sandbox(place, slots=2) as backend:
        where = sandbox_container(backend)
        assert where is not None
        engine, cid = where
        with pytest.raises(SandboxUnavailable):  # the sandbox went away under the trajectory: void
            async with backend.trajectory("t") as ex:
                command = ex.exec(f"bash -c 'sleep 900; :' {marker}", timeout=600, max_output_bytes=100)
                task = asyncio.create_task(command)
                deadline = time.monotonic() + 30
                while not await sandbox_processes(backend, marker) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                assert await sandbox_processes(backend, marker), "the command never started"
                assert host_processes(marker) and _in_container(cid)  # seen from this machine too
                await asyncio.to_thread(kill_container, engine, cid, sig)
                deadline = time.monotonic() + 30
                while (await asyncio.to_thread(container_state, engine, cid))["Running"]:
                    assert time.monotonic() < deadline, f"container still runs 30 s after signal {sig}"
                    await asyncio.sleep(0.2)
                state = await asyncio.to_thread(container_state, engine, cid)
                # SIGTERM: PID 1 passes it on, the server stops its slots and exits 0; SIGKILL: 128 + 9.
                assert state["ExitCode"] == (0 if sig == signal.SIGTERM else 128 + signal.SIGKILL), state
                deadline = time.monotonic() + 10
                while (host_processes(marker) or _in_container(cid)) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                assert host_processes(marker) == [] and _in_container(cid) == []
                await task
