"""The sandbox backend protocol and the one implementation all platforms share.

A backend = a `SandboxProvider` (how sandbox_server instances are started on a
platform: local processes, Nomad allocations, Modal sandboxes) + a `SlotPool` over
them. Only the provider differs between platforms, so one test suite covers all three.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from slots.client import SandboxError
from slots.executor import SlotExecutor
from slots.pool import Slot, SlotPool, SlotPoolConfig, SandboxProvider
from tools.executor import ExecResult

__all__ = ["ExecCall", "SandboxBackend", "SlotBackend"]


@dataclass(frozen=True)
class ExecCall:
    command: str
    timeout: float = 30.0
    max_output_bytes: int = 100_000
    stdin: str | None = None
    network: bool = False


class SandboxBackend(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def acquire(self, timeout: float | None = None) -> Slot: ...

    async def release(self, slot: Slot) -> None: ...

    async def execute(self, slot: Slot, call: ExecCall) -> ExecResult: ...

    async def execute_batch(self, calls: list[tuple[Slot, ExecCall]]) -> list[ExecResult | SandboxError]: ...

    async def artifacts(self, slot: Slot, path: str = ".") -> list[dict]: ...

    def executor(self, slot: Slot) -> SlotExecutor: ...


class SlotBackend:
    """`SandboxBackend` over any provider."""

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

    async def execute(self, slot: Slot, call: ExecCall) -> ExecResult:
        return await self.executor(slot).exec(
            call.command, timeout=call.timeout, max_output_bytes=call.max_output_bytes, stdin=call.stdin, network=call.network
        )

    async def execute_batch(self, calls: list[tuple[Slot, ExecCall]]) -> list[ExecResult | SandboxError]:
        """Run calls in many slots at once; calls to the same sandbox travel in one request."""
        results = await asyncio.gather(*(self.execute(s, c) for s, c in calls), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, (SandboxError, OSError)):
                raise r
        return list(results)  # type: ignore[arg-type]

    async def artifacts(self, slot: Slot, path: str = ".") -> list[dict]:
        return (await self.pool.client(slot).list_artifacts(slot.index, path))["files"]

    async def archive(self, slot: Slot, path: str = ".") -> bytes:
        return await self.pool.client(slot).archive(slot.index, path)
