"""Tool backend over sandbox slots: each trajectory gets a slot, reset and released after.

Selected in the env config with `tool_backend: sandbox`; `sandbox.backend.kind` picks
where the sandbox_server instances run (local processes, Nomad, Modal).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

from pydantic import BaseModel, Field

from backends import BackendConfig, LocalBackendConfig, SlotBackend, make_backend
from slots.client import SandboxUnavailable
from slots.executor import SlotExecutor
from slots.pool import SlotState

__all__ = ["SandboxToolBackendConfig", "SandboxToolBackend"]


class SandboxToolBackendConfig(BaseModel):
    kind: Literal["sandbox"] = "sandbox"
    backend: BackendConfig = Field(default_factory=LocalBackendConfig, description="local | nomad | modal")
    acquire_timeout_s: float | None = Field(None, gt=0, description="Override of the pool's acquire timeout")


class SandboxToolBackend:
    """`ToolBackend` (environments/tool_backend.py) whose executors are sandbox slots."""

    def __init__(self, config: SandboxToolBackendConfig | None = None, backend: SlotBackend | None = None) -> None:
        self.config = config or SandboxToolBackendConfig()
        self.backend = backend or make_backend(self.config.backend)

    async def start(self) -> None:
        await self.backend.start()

    async def stop(self) -> None:
        await self.backend.stop()

    @asynccontextmanager
    async def trajectory(self, task_id: str) -> AsyncIterator[SlotExecutor]:
        slot = await self.backend.acquire(self.config.acquire_timeout_s)
        try:
            yield self.backend.executor(slot)
        finally:
            # Shielded: a cancelled trajectory still gives its slot back (reset) to the pool.
            await asyncio.shield(self.backend.release(slot))
        if slot.state is SlotState.DEAD:
            # The sandbox died under this trajectory: whatever it scored is not the model's doing.
            raise SandboxUnavailable(f"sandbox {slot.sandbox.name} died during trajectory {task_id}; the result is void")
