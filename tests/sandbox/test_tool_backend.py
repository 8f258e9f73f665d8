"""Sandbox slots as the env's tool backend: real tools, real servers, many trajectories at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess

import pytest

from backends import LocalBackendConfig, make_backend
from environments.sandbox_backend import SandboxToolBackendConfig
from model_tools import default_registry
from slots.client import SandboxUnavailable
from slots.client import SlotState
from slots.pool import SlotAcquireTimeout, SlotPool, SlotPoolConfig
from tools.context import ToolContext


def backend_for(tmp_path, *, sandboxes: int, slots: int, acquire_timeout_s: float | None = None) -> SlotPool:
    pool = SlotPoolConfig(
        slots_per_sandbox=slots, min_sandboxes=sandboxes, max_sandboxes=sandboxes, health_interval_s=30
    )
    section = SandboxToolBackendConfig(
        backend=LocalBackendConfig(pool=pool, data_root=str(tmp_path)), acquire_timeout_s=acquire_timeout_s
    )
    return make_backend(section.resolved_backend())


async def call(registry, ctx, name, **args) -> dict:
    return json.loads(await registry.call(name, args, ctx))


@pytest.mark.slow
async def test_32_concurrent_trajectories_on_4_sandboxes_of_8_slots(tmp_path):
    backend = backend_for(tmp_path, sandboxes=4, slots=8)
    registry = default_registry()
    await backend.start()
    seen_slots: set[str] = set()

    async def trajectory(i: int) -> str:
        async with backend.trajectory(f"t{i}") as executor:
            seen_slots.add(executor.slot.id)
            ctx = ToolContext(executor=executor, task_id=f"t{i}")
            assert (await call(registry, ctx, "write_file", path="in.txt", content=f"{i}\n"))["bytes_written"] == len(
                f"{i}\n"
            )
            out = await call(
                registry, ctx, "terminal", command="n=$(cat in.txt); echo $((n*n)) > out.txt; ls -A | tr '\\n' ' '"
            )
            assert out["exit_code"] == 0 and out["output"] == "in.txt out.txt "  # no other trajectory's files
            py = await call(registry, ctx, "python", code=f"print(int(open('out.txt').read()) + {i})")
            return py["output"].strip()

    try:
        results = await asyncio.gather(*(trajectory(i) for i in range(32)))
        assert results == [str(i * i + i) for i in range(32)]
        assert len(seen_slots) == 32
        assert len(backend.sandboxes) == 4
        assert all(s.state is SlotState.FREE for s in backend.slots())
        # calls that arrived together travelled together
        batches = sum(sb.batcher.batches_sent for sb in backend._sandboxes.values())
        calls = sum(sb.batcher.calls_sent for sb in backend._sandboxes.values())
        assert calls == 32 * 3 and batches < calls
    finally:
        await backend.stop()
    out = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert out == []


async def test_cancelled_trajectory_releases_its_slot_and_kills_its_command(tmp_path):
    backend = backend_for(tmp_path, sandboxes=1, slots=1)
    await backend.start()
    try:
        started = asyncio.Event()

        async def runs_forever() -> None:
            async with backend.trajectory("t") as executor:
                await executor.write_file("left.txt", b"x")
                started.set()
                await executor.exec("sleep 337.5", timeout=60, max_output_bytes=100)

        task = asyncio.create_task(runs_forever())
        await started.wait()
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the only slot comes back, reset
        async with backend.trajectory("next") as executor:
            assert (await executor.exec("ls -A", timeout=5, max_output_bytes=100)).output == ""
        assert subprocess.run(["pgrep", "-f", "sleep 337.5"], capture_output=True).returncode == 1
    finally:
        await backend.stop()


async def test_a_sandbox_dying_mid_trajectory_voids_the_trajectory(tmp_path):
    backend = backend_for(tmp_path, sandboxes=1, slots=2)
    await backend.start()
    try:
        with pytest.raises(SandboxUnavailable, match="died during trajectory"):
            async with backend.trajectory("t") as executor:
                provider = backend.provider
                os.kill(provider.pid(executor.slot.sandbox), signal.SIGKILL)
                with pytest.raises(SandboxUnavailable):
                    await executor.exec("true", timeout=5, max_output_bytes=100)
        assert backend.replaced == 1
        async with backend.trajectory("after") as executor:
            assert (await executor.exec("echo ok", timeout=5, max_output_bytes=100)).output == "ok\n"
    finally:
        await backend.stop()


async def test_the_sections_acquire_timeout_overrides_the_pools(tmp_path):
    backend = backend_for(tmp_path, sandboxes=1, slots=1, acquire_timeout_s=0.5)
    assert backend.config.acquire_timeout_s == 0.5
    await backend.start()
    try:
        async with backend.trajectory("holds the only slot"):
            with pytest.raises(SlotAcquireTimeout, match="within 0.5s"):
                async with backend.trajectory("waits"):
                    pass
    finally:
        await backend.stop()
