"""The verifier's root commands: only a server started with --allow-root-commands runs them (container
backends), never the local backend's. Real sandbox_server processes under real bubblewrap on this machine;
no root command runs here. That the agent's tools never get root where the server allows it is played on
the docker backend (test_docker_tasks.py).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import aiohttp
import pytest

from backends import LocalBackendConfig, make_backend
from backends.process import start_sandbox_process
from slots.client import SandboxAddress, SandboxClient, SandboxError, Slot
from slots.executor import ExecPolicy, SandboxBatcher, SlotExecutor
from slots.pool import SlotPoolConfig


@asynccontextmanager
async def server_executor(tmp_path, *extra: str, policy: ExecPolicy | None = None):
    proc = await start_sandbox_process(data_dir=tmp_path / "sb", slots=1, extra_args=list(extra))
    try:
        assert proc.isolation, "bubblewrap isolation is needed for this test"
        address = SandboxAddress("root-test", proc.url, proc.token)
        async with aiohttp.ClientSession() as session:
            client = SandboxClient(address, session)
            batcher = SandboxBatcher(client)
            slot = Slot("root-test/0", address, "0", "/workspace")
            try:
                yield client, SlotExecutor(slot, batcher, policy=policy)
            finally:
                await batcher.close()
    finally:
        await proc.stop()


async def test_a_server_without_the_flag_refuses_root_commands(tmp_path):
    async with server_executor(tmp_path) as (client, _):
        with pytest.raises(SandboxError) as info:
            await client._json(
                "POST",
                "/slots/0/exec",
                json={"command": "id -u", "timeout": 10, "max_output_bytes": 100, "as_root": True},
                timeout=30,
            )
    assert info.value.status == 403 and info.value.kind == "root_refused"


async def test_the_local_backend_never_runs_the_verifier_as_root(tmp_path):
    """Even when the env's policy asks for a root verifier, the local backend's servers refuse it."""
    pool_config = SlotPoolConfig(slots_per_sandbox=1, min_sandboxes=1, max_sandboxes=1, health_interval_s=30)
    pool = make_backend(LocalBackendConfig(pool=pool_config, data_root=str(tmp_path / "sb")))
    await pool.start()
    try:
        async with pool.trajectory("t", ExecPolicy(verifier_as_root=True)) as executor:
            with pytest.raises(SandboxError) as info:
                await executor.verify_exec("id -u", timeout=10, max_output_bytes=100)
            plain = await executor.exec("id -u", timeout=10, max_output_bytes=100)
    finally:
        await pool.stop()
    assert info.value.kind == "root_refused"
    assert plain.exit_code == 0 and plain.output.strip() != "0"
