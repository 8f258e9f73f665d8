"""The one sandbox backend all platforms share.

A backend = a `SandboxProvider` (how sandbox_server instances are started on a
platform: local processes, Nomad allocations, Modal sandboxes) + a `SlotPool` over
them. Only the provider differs between platforms, so one test suite covers all three.
"""

from __future__ import annotations

from slots.executor import SlotExecutor
from slots.pool import Slot, SlotPool, SlotPoolConfig, SandboxProvider

__all__ = ["SlotBackend"]


class SlotBackend:
    """The slot pool over any provider: what every platform shares."""

    def __init__(self, provider: SandboxProvider, pool: SlotPoolConfig) -> None:
        self.provider = provider
        self.pool = SlotPool(provider, pool)

    async def start(self) -> None:
        try:
            await self.pool.start()
        except BaseException:
            await self.pool.stop()  # half-started sandboxes must not outlive a failed start
            raise

    async def stop(self) -> None:
        await self.pool.stop()

    async def acquire(self, timeout: float | None = None) -> Slot:
        return await self.pool.acquire(timeout)

    async def release(self, slot: Slot) -> None:
        await self.pool.release(slot)

    def executor(self, slot: Slot) -> SlotExecutor:
        return self.pool.executor(slot)

    async def artifacts(self, slot: Slot, path: str = ".") -> list[dict]:
        return (await self.pool.client(slot).list_artifacts(slot.index, path))["files"]

    async def archive(self, slot: Slot, path: str = ".") -> bytes:
        return await self.pool.client(slot).archive(slot.index, path)
