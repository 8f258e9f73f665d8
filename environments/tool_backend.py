"""Where a trajectory's tools run, chosen by config and owned by the env.

A backend is started with the env and stopped with it; each trajectory enters
`backend.trajectory(task_id)` and gets a `ToolExecutor` that is cleaned up (workspace
removed, or sandbox slot reset and released) when it leaves, also on errors and
cancellation.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from sandbox_server.tree import remove_tree_quietly
from tools.executor import LocalWorkspace, ToolExecutor

__all__ = ["ToolBackend", "LocalToolBackendConfig", "LocalToolBackend"]


class ToolBackend(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def trajectory(self, task_id: str) -> AbstractAsyncContextManager[ToolExecutor]:
        """An async context manager yielding the trajectory's executor."""
        ...


class LocalToolBackendConfig(BaseModel):
    kind: Literal["local"] = "local"
    workspace_root: str | None = Field(
        None, description="Parent directory of per-trajectory workspaces (default: a temp dir)"
    )
    keep_workspaces: bool = Field(False, description="Leave workspaces on disk after a trajectory (debugging)")


class LocalToolBackend:
    """One fresh directory per trajectory on this machine; processes run unisolated."""

    def __init__(self, config: LocalToolBackendConfig | None = None) -> None:
        self.config = config or LocalToolBackendConfig()
        self._root: Path | None = None
        self._own_root = False

    async def start(self) -> None:
        if self.config.workspace_root:
            self._root = Path(self.config.workspace_root)
            self._root.mkdir(parents=True, exist_ok=True)
        else:
            self._root = Path(tempfile.mkdtemp(prefix="hermes-rl-ws-"))
            self._own_root = True

    async def stop(self) -> None:
        if self._root is not None and self._own_root and not self.config.keep_workspaces:
            await asyncio.to_thread(remove_tree_quietly, self._root)
        self._root = None

    @asynccontextmanager
    async def trajectory(self, task_id: str) -> AsyncIterator[ToolExecutor]:
        if self._root is None:
            raise RuntimeError("LocalToolBackend.trajectory() before start(); start the backend with the env")
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in task_id)[:60]
        path = self._root / f"{safe}-{uuid.uuid4().hex[:8]}"
        workspace = LocalWorkspace(path)
        try:
            yield workspace
        finally:
            if not self.config.keep_workspaces:
                await asyncio.to_thread(remove_tree_quietly, path)
