"""Local backend: K sandbox_server processes on 127.0.0.1 (the embedded default)."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from backends.launch import launch_all
from backends.process import SandboxProcess, start_sandbox_process
from sandbox_server.isolation import SlotLimits
from sandbox_server.tree import remove_tree_quietly
from slots.client import SandboxAddress
from slots.pool import SlotPool, SlotPoolConfig

__all__ = ["LocalBackendConfig", "LocalSandboxProvider", "local_backend", "open_root"]


def open_root(configured: str | None, prefix: str) -> tuple[Path, bool]:
    """(the directory, whether it is ours to remove): `configured`, made if missing, or a fresh temp dir."""
    if configured:
        root = Path(configured)
        root.mkdir(parents=True, exist_ok=True)
        return root, False
    return Path(tempfile.mkdtemp(prefix=prefix)), True


class LocalBackendConfig(BaseModel):
    kind: Literal["local"] = "local"
    pool: SlotPoolConfig = Field(default_factory=SlotPoolConfig)
    data_root: str | None = Field(None, description="Where the servers keep workspaces (default: a temp dir)")
    python: str | None = Field(None, description="Interpreter that runs sandbox_server (default: this one)")
    bwrap: str = "bwrap"

    @property
    def in_containers(self) -> bool:
        """Processes on this machine: no image of their own, root would be this machine's (`in_containers`: backends/__init__.py)."""
        return False

    extra_ro_paths: list[str] = Field(
        default_factory=list, description="Host paths slots see read-only at the same place (e.g. prepared envs)"
    )
    limits: SlotLimits = Field(default_factory=SlotLimits, description="Per-slot limits the servers enforce")
    workspace_mount: str = Field("/workspace", description="Where a slot's workspace appears inside the sandbox")


class LocalSandboxProvider:
    def __init__(self, config: LocalBackendConfig) -> None:
        self.config = config
        self._procs: dict[str, SandboxProcess] = {}
        self._root: Path | None = None
        self._own_root = False

    async def start(self) -> None:
        self._root, self._own_root = open_root(self.config.data_root, "hermes-sandboxes-")

    async def launch(self, count: int) -> list[SandboxAddress]:
        assert self._root is not None, "start() first"
        root = self._root

        async def one() -> SandboxAddress:
            proc = await start_sandbox_process(
                data_dir=root / f"sb-{uuid.uuid4().hex[:8]}",
                slots=self.config.pool.slots_per_sandbox,
                python=self.config.python,
                bwrap=self.config.bwrap,
                extra_args=[
                    *self.config.limits.cli_args(),
                    *(f"--ro-path={p}" for p in self.config.extra_ro_paths),
                    "--workspace-mount",
                    self.config.workspace_mount,
                ],
            )
            address = SandboxAddress(f"local-{proc.pid}", proc.url, proc.token)
            self._procs[address.name] = proc
            return address

        return await launch_all(count, one)

    async def alive(self, address: SandboxAddress) -> bool:
        proc = self._procs.get(address.name)
        return proc is not None and proc.proc.returncode is None

    def pid(self, address: SandboxAddress) -> int:
        return self._procs[address.name].pid

    async def terminate(self, address: SandboxAddress) -> None:
        proc = self._procs.pop(address.name, None)
        if proc is not None:
            await proc.stop()
            await asyncio.to_thread(remove_tree_quietly, proc.data_dir)

    async def stop(self) -> None:
        await asyncio.gather(*(self.terminate(SandboxAddress(n, "", "")) for n in list(self._procs)))
        if self._root is not None and self._own_root:
            await asyncio.to_thread(remove_tree_quietly, self._root)
        self._root = None


def local_backend(config: LocalBackendConfig | None = None) -> SlotPool:
    config = config or LocalBackendConfig()
    return SlotPool(LocalSandboxProvider(config), config.pool)
