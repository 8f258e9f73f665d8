"""A pool of slots spread over sandboxes: acquire, release-with-reset, health, replacement, scale-up.

Where sandboxes come from is a `SandboxProvider` (backends/): local processes, Nomad
allocations or Modal sandboxes. The pool only speaks sandbox_server's HTTP API. It is also
the `ToolBackend` (environments/tool_backend.py) of `tool_backend: sandbox`: each trajectory
gets a slot's executor, and the slot is reset and released when the trajectory leaves.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
from pydantic import BaseModel, Field

from slots.client import SandboxAddress, SandboxClient, SandboxError, SandboxUnavailable, Slot, SlotState
from slots.executor import ExecPolicy, SandboxBatcher, SlotExecutor, python_command

__all__ = ["SlotPoolConfig", "SandboxProvider", "SlotPool", "SlotAcquireTimeout"]

log = logging.getLogger(__name__)


class SlotPoolConfig(BaseModel):
    slots_per_sandbox: int = Field(8, ge=1, le=256)
    min_sandboxes: int = Field(1, ge=0)
    max_sandboxes: int = Field(4, ge=1)
    acquire_timeout_s: float = Field(300.0, gt=0, description="How long acquire() waits for a free slot")
    health_interval_s: float = Field(5.0, gt=0, description="Seconds between health checks of each sandbox")
    reset_timeout_s: float = Field(60.0, gt=0)
    ready_timeout_s: float = Field(
        120.0, gt=0, description="How long a started sandbox may take to answer /health (retried until then)"
    )
    batch_window_s: float = Field(
        0.0, ge=0, description="Calls to one sandbox within this window go as one request; 0: those of one loop turn"
    )
    max_connections: int = Field(256, ge=1, description="HTTP connections to all sandboxes together")


class SlotAcquireTimeout(TimeoutError):
    """No slot became free in time."""


class SandboxProvider(Protocol):
    """Brings sandbox_server instances up and down on some platform."""

    async def start(self) -> None: ...

    async def launch(self, count: int) -> list[SandboxAddress]:
        """Start `count` more sandboxes, each holding the pool's slots_per_sandbox slots; return when they answer."""
        ...

    async def alive(self, address: SandboxAddress) -> bool:
        """The platform's view (process exited, allocation failed, sandbox terminated)."""
        ...

    async def terminate(self, address: SandboxAddress) -> None: ...

    async def stop(self) -> None:
        """Remove every sandbox this provider started (and, where the platform allows, orphans)."""
        ...


@dataclass(eq=False)
class _Sandbox:
    address: SandboxAddress
    client: SandboxClient
    batcher: SandboxBatcher
    slots: list[Slot] = field(default_factory=list)
    python: str = "python -"
    dead: bool = False


class SlotPool:
    def __init__(self, provider: SandboxProvider, config: SlotPoolConfig | None = None) -> None:
        self.provider = provider
        self.config = config or SlotPoolConfig()
        if self.config.min_sandboxes > self.config.max_sandboxes:
            raise ValueError("min_sandboxes must not exceed max_sandboxes")
        self._sandboxes: dict[str, _Sandbox] = {}
        self._free: list[Slot] = []
        self._cond = asyncio.Condition()
        self._session: aiohttp.ClientSession | None = None
        self._health: asyncio.Task | None = None
        self._scaling: asyncio.Task | None = None
        self._launching = 0
        self.replaced = 0  # sandboxes replaced after they died (a counter for tests/metrics)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.config.max_connections))
        try:
            await self.provider.start()
            if self.config.min_sandboxes:
                await self._add(self.config.min_sandboxes)
        except BaseException:
            await self.stop()  # half-started sandboxes must not outlive a failed start
            raise
        self._health = asyncio.create_task(self._health_loop())

    async def stop(self) -> None:
        for task in (self._health, self._scaling):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for sb in self._sandboxes.values():
            await sb.batcher.close()
        self._sandboxes.clear()
        self._free.clear()
        try:
            await self.provider.stop()
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None

    # -- slots -----------------------------------------------------------------------------
    @property
    def sandboxes(self) -> list[SandboxAddress]:
        return [sb.address for sb in self._sandboxes.values() if not sb.dead]

    def slots(self) -> list[Slot]:
        return [s for sb in self._sandboxes.values() for s in sb.slots]

    async def acquire(self, timeout: float | None = None) -> Slot:
        timeout = self.config.acquire_timeout_s if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout):
                async with self._cond:
                    while not self._free:
                        self._maybe_scale_up()
                        await self._cond.wait()
                    slot = self._free.pop(0)
                    slot.state = SlotState.BUSY
                    return slot
        except TimeoutError:
            busy = sum(s.state is SlotState.BUSY for s in self.slots())
            raise SlotAcquireTimeout(
                f"no free sandbox slot within {timeout}s ({busy} busy, {len(self.sandboxes)} sandboxes of "
                f"max {self.config.max_sandboxes}); raise max_sandboxes or acquire_timeout_s, or run fewer trajectories at once"
            ) from None

    async def release(self, slot: Slot) -> None:
        """Reset the slot's workspace and make it available again (a dead sandbox's slot is dropped)."""
        sb = self._sandboxes.get(slot.sandbox.name)
        if sb is None or sb.dead or slot.state is SlotState.DEAD:
            slot.state = SlotState.DEAD
            return
        slot.state = SlotState.RESETTING
        for attempt in (1, 2):
            try:
                await sb.client.reset(slot.index, timeout=self.config.reset_timeout_s)
                break
            except SandboxError as exc:
                log.warning("reset of slot %s failed (%s, attempt %d); checking its sandbox", slot.id, exc, attempt)
                if not await self._check(sb):
                    slot.state = SlotState.DEAD  # the sandbox was replaced, with fresh slots
                    return
        else:
            # The sandbox answers but cannot clean this slot: a slot that is not pristine must not be
            # handed out again, and a pool that only shrinks starves. Replace the whole sandbox.
            slot.state = SlotState.DEAD
            if not sb.dead:
                await self._replace(sb)
            return
        async with self._cond:
            if slot.state is SlotState.RESETTING and not sb.dead:
                slot.state = SlotState.FREE
                self._free.append(slot)
                self._cond.notify()

    @asynccontextmanager
    async def trajectory(self, task_id: str, policy: ExecPolicy | None = None) -> AsyncIterator[SlotExecutor]:
        """A slot's executor for one trajectory; the slot is reset and released when it leaves."""
        slot = await self.acquire()
        try:
            yield self.executor(slot, policy)
        finally:
            # Shielded: a cancelled trajectory still gives its slot back (reset) to the pool.
            await asyncio.shield(self.release(slot))
        if slot.state is SlotState.DEAD:
            # The sandbox died under this trajectory: whatever it scored is not the model's doing.
            raise SandboxUnavailable(
                f"sandbox {slot.sandbox.name} died during trajectory {task_id}; the result is void"
            )

    def executor(self, slot: Slot, policy: ExecPolicy | None = None) -> SlotExecutor:
        sb = self._sandboxes.get(slot.sandbox.name)
        if sb is None:
            raise SandboxUnavailable(f"slot {slot.id} belongs to a sandbox that is gone")
        return SlotExecutor(slot, sb.batcher, python=sb.python, policy=policy)

    def client(self, slot: Slot) -> SandboxClient:
        sb = self._sandboxes.get(slot.sandbox.name)
        if sb is None:
            raise SandboxUnavailable(f"slot {slot.id} belongs to a sandbox that is gone")
        return sb.client

    async def artifacts(self, slot: Slot, path: str = ".") -> list[dict]:
        """The files under `path` in the slot's workspace (path, size, ...)."""
        return (await self.client(slot).list_artifacts(slot.index, path))["files"]

    async def archive(self, slot: Slot, path: str = ".") -> bytes:
        """`path` in the slot's workspace as a tar.gz."""
        return await self.client(slot).archive(slot.index, path)

    # -- growing, checking, replacing ---------------------------------------------------------
    def _maybe_scale_up(self) -> None:
        live = len(self.sandboxes) + self._launching
        if self._scaling is None and live < self.config.max_sandboxes:
            self._scaling = asyncio.create_task(self._scale_up())

    async def _scale_up(self) -> None:
        try:
            await self._add(1)
        except Exception as exc:  # noqa: BLE001 - waiting acquirers time out with the pool's message
            log.error("could not start another sandbox: %s", exc)
        finally:
            self._scaling = None
            async with self._cond:
                self._cond.notify_all()

    async def _add(self, count: int) -> None:
        assert self._session is not None, "SlotPool.start() first"
        self._launching += count
        try:
            addresses = await self.provider.launch(count)
        finally:
            self._launching -= count
        results = await asyncio.gather(*(self._admit(a) for a in addresses), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def _admit(self, address: SandboxAddress) -> None:
        """Wait for a launched sandbox to answer, check it isolates, and hand out its slots."""
        assert self._session is not None
        client = SandboxClient(address, self._session)
        try:
            health = await client.wait_ready(
                self.config.ready_timeout_s, functools.partial(self.provider.alive, address)
            )
            if not health["isolation"]["available"]:
                raise SandboxError(
                    f"sandbox {address.name} cannot isolate commands: {health['isolation']['reason']}",
                    kind="isolation_unavailable",
                )
        except BaseException:
            await asyncio.shield(self.provider.terminate(address))  # never keep a sandbox nobody tracks
            raise
        sb = _Sandbox(address, client, SandboxBatcher(client, window_s=self.config.batch_window_s))
        sb.python = python_command(health.get("python"))
        sb.slots = [Slot(f"{address.name}/{s['id']}", address, s["id"], health["workspace"]) for s in health["slots"]]
        async with self._cond:
            self._sandboxes[address.name] = sb
            self._free.extend(sb.slots)
            self._cond.notify_all()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                await self.check_now()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive one bad round
                log.error("sandbox health check failed: %s", exc)

    async def _check(self, sb: _Sandbox) -> bool:
        ok = await self.provider.alive(sb.address)
        if ok:
            try:
                await sb.client.health(timeout=min(10.0, self.config.health_interval_s * 2))
            except SandboxError:
                ok = False
        if not ok and not sb.dead:
            await self._replace(sb)
        return ok

    async def check_now(self) -> int:
        """Check every sandbox at once; returns how many were found dead (and replaced)."""
        results = await asyncio.gather(*(self._check(sb) for sb in list(self._sandboxes.values()) if not sb.dead))
        return sum(not ok for ok in results)

    async def _replace(self, sb: _Sandbox) -> None:
        log.warning("sandbox %s is gone; replacing its %d slots", sb.address.name, len(sb.slots))
        sb.dead = True
        async with self._cond:
            for slot in sb.slots:
                slot.state = SlotState.DEAD
            self._free = [s for s in self._free if s.sandbox.name != sb.address.name]
            del self._sandboxes[sb.address.name]
        await sb.batcher.close()
        try:
            await self.provider.terminate(sb.address)
        except Exception as exc:  # noqa: BLE001 - the sandbox is already unusable; log and go on
            log.warning("terminating dead sandbox %s failed: %s", sb.address.name, exc)
        self.replaced += 1
        try:
            await self._add(1)
        except Exception as exc:  # noqa: BLE001 - the pool runs smaller; acquire() scales up again later
            log.error("could not start a replacement for sandbox %s: %s", sb.address.name, exc)
