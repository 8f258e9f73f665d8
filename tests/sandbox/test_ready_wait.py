"""A platform reports a sandbox running before its server listens: the pool waits for /health.

The provider here hands back an address at once and starts a real sandbox_server on it
seconds later (as a Nomad allocation, a Modal tunnel or a container do).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from slots.client import SandboxAddress, SandboxUnavailable
from slots.pool import SlotPool, SlotPoolConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LateServers:
    """Each launched sandbox's server starts `delay_s` after launch() returned its address."""

    def __init__(self, root: Path, delay_s: float, *, never: bool = False) -> None:
        self.root, self.delay_s, self.never = root, delay_s, never
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.starters: list[asyncio.Task] = []
        self.terminated: list[str] = []

    async def start(self) -> None:
        pass

    async def _late(self, name: str, port: int, token: str) -> None:
        await asyncio.sleep(self.delay_s)
        if self.never:
            return
        token_file = self.root / f"{name}.token"
        token_file.write_text(token)
        argv = [sys.executable, "-m", "sandbox_server", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--slots", "2", "--data-dir", str(self.root / name), "--remove-data-dir"]
        argv += ["--token-file", str(token_file)]
        self.procs[name] = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )

    async def launch(self, count: int) -> list[SandboxAddress]:
        out = []
        for _ in range(count):
            name, port = f"late-{len(self.starters)}", _free_port()
            address = SandboxAddress(name, f"http://127.0.0.1:{port}", "t0ken-" + name)
            self.starters.append(asyncio.create_task(self._late(name, port, address.token)))
            out.append(address)
        return out

    async def alive(self, address: SandboxAddress) -> bool:
        proc = self.procs.get(address.name)
        return proc is None or proc.returncode is None  # not started yet counts as starting

    async def terminate(self, address: SandboxAddress) -> None:
        self.terminated.append(address.name)
        proc = self.procs.pop(address.name, None)
        if proc is not None and proc.returncode is None:
            proc.terminate()
            await proc.wait()

    async def stop(self) -> None:
        for task in self.starters:
            task.cancel()
        await asyncio.gather(*self.starters, return_exceptions=True)
        for name in list(self.procs):
            await self.terminate(SandboxAddress(name, "", ""))


async def test_pool_start_waits_for_a_server_that_listens_seconds_after_launch(tmp_path):
    provider = LateServers(tmp_path, delay_s=3.0)
    pool = SlotPool(provider, SlotPoolConfig(slots_per_sandbox=2, min_sandboxes=2, max_sandboxes=2, ready_timeout_s=60))
    await pool.start()
    try:
        assert len(pool.slots()) == 4
        async with pool.trajectory("t") as ex:
            result = await ex.exec("echo ready", timeout=30, max_output_bytes=1000)
        assert result.exit_code == 0 and result.output.strip() == "ready"
    finally:
        await pool.stop()


async def test_a_server_that_never_answers_fails_start_with_the_deadline_named_and_is_terminated(tmp_path):
    provider = LateServers(tmp_path, delay_s=0.0, never=True)
    pool = SlotPool(provider, SlotPoolConfig(slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=1, ready_timeout_s=2))
    with pytest.raises(SandboxUnavailable, match=r"did not answer /health within 2s.*ready_timeout_s"):
        await pool.start()
    assert provider.terminated == ["late-0"]
