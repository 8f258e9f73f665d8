"""The verifier's root commands: only a server started with --allow-root-commands runs them, and only
the env's verifier asks (never a tool the agent calls, never the local backend).

The server here is a real sandbox_server process under real bubblewrap on this machine; the root
command runs in its own namespaces with the capabilities a container's root would have, minus
CAP_SYS_ADMIN (it cannot remount what the slot sees).
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
from tests.security.conftest import play


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


async def test_the_agents_tools_never_get_root_even_where_the_server_allows_it(tmp_path):
    """A hostile policy asks every tool for root; only the env's verifier call runs as root."""
    policy = ExecPolicy(verifier_as_root=True)
    async with server_executor(tmp_path, "--allow-root-commands", policy=policy) as (_, executor):
        asks = {"as_root": True, "user": "root", "root": True, "privileged": True}
        messages = await play(
            executor,
            [
                [("terminal", {"command": "id -u > uid-terminal.txt; id -u", **asks})],
                [("python", {"code": "import os; print(os.getuid())", **asks})],
                [("terminal", {"command": "touch /etc/hermes-root-was-here; echo rc=$?", **asks})],
            ],
        )
        written = (await executor.read_file("uid-terminal.txt")).decode().strip()
        verifier = await executor.verify_exec("id -u; touch /etc/x 2>&1; echo rc=$?", timeout=10, max_output_bytes=1000)
    outputs = [str(m["result"]) for m in messages]
    assert written != "0" and written.isdigit()
    assert "'0\\n'" not in outputs[1] and "rc=0" not in outputs[2], outputs
    # The verifier is root (uid 0) but the slot's root filesystem stays read-only to it.
    lines = verifier.output.split("\n")
    assert lines[0] == "0" and "rc=0" not in verifier.output, verifier.output
