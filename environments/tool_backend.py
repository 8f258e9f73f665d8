"""Where a trajectory's tools run, chosen by config and owned by the env.

A backend is started with the env and stopped with it; each trajectory enters
`backend.trajectory(task_id)` and gets a `ToolExecutor` that is cleaned up (workspace
removed, or sandbox slot reset and released) when it leaves, also on errors and
cancellation.

Model code is confined by default: `sandbox` slots (bubblewrap: its own uid, no network, only its
workspace and read-only system dirs). `local` runs it as this user with this machine's files and
network, so it, and a machine that cannot confine, need the explicit `unconfined_tools` opt-out
(docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from backends import LocalBackendConfig, make_backend
from backends.local import open_root
from environments.sandbox_backend import SandboxToolBackendConfig
from sandbox_server.isolation import SYSTEM_DIRS, probe_bwrap
from sandbox_server.tree import remove_tree_quietly
from tools.executor import LocalWorkspace, ToolExecutor

__all__ = ["ToolBackend", "LocalToolBackendConfig", "LocalToolBackend", "ConfinementError", "select_tool_backend"]

logger = logging.getLogger(__name__)

OPT_OUT = (
    "set unconfined_tools (--env.runtime.unconfined_tools true; batch_runner: --runtime.unconfined_tools true) to run model code "
    "as this user with this machine's files and network (docs/security.md)"
)


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
    """One fresh directory per trajectory on this machine; processes run unisolated (`unconfined_tools` only)."""

    def __init__(self, config: LocalToolBackendConfig | None = None) -> None:
        self.config = config or LocalToolBackendConfig()
        self._root: Path | None = None
        self._own_root = False

    async def start(self) -> None:
        self._root, self._own_root = open_root(self.config.workspace_root, "hermes-rl-ws-")

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


class ConfinementError(RuntimeError):
    """Model code could not be confined and the user did not opt out: the run must not start."""


async def select_tool_backend(
    kind: Literal["local", "sandbox"],
    workspace: LocalToolBackendConfig,
    sandbox: SandboxToolBackendConfig,
    *,
    unconfined: bool,
) -> ToolBackend:
    """The backend `kind` names, refusing to run model code unconfined unless `unconfined` says so."""
    if kind == "local":
        if not unconfined:
            raise ConfinementError(
                f"tool_backend local does not confine model code; use sandbox (the default), or {OPT_OUT}"
            )
        return LocalToolBackend(workspace)
    backend = sandbox.resolved_backend()
    if isinstance(backend, LocalBackendConfig):  # Nomad/Modal sandboxes report bubblewrap failures themselves
        status = await probe_bwrap(backend.bwrap)
        reason = status.reason
        shown = exposing_dir(PROJECT_ROOT, slot_read_only_dirs(backend))
        if status.available and shown is not None:
            reason = (
                f"sandbox slots see {shown} read-only, which holds this project ({PROJECT_ROOT}: its source and "
                "gold data); install it outside the system directories and the interpreter's prefix"
            )
        if reason is not None:
            if not unconfined:
                raise ConfinementError(f"cannot confine model code: {reason}; or {OPT_OUT}")
            logger.warning("model code runs UNCONFINED (unconfined_tools): %s", reason)
            return LocalToolBackend(workspace)
    return make_backend(backend)


# The checkout (or installed copy) this code runs from: model code must not see it.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def slot_read_only_dirs(backend: LocalBackendConfig) -> list[str]:
    """Host directories a local sandbox server shows its slots read-only (sandbox_server/isolation.py)."""
    dirs = list(SYSTEM_DIRS)
    if backend.python is None:  # the server runs on this interpreter and shows its prefixes
        dirs += [sys.prefix, sys.base_prefix]
    return dirs


def exposing_dir(root: Path, shown: list[str]) -> str | None:
    """The first of `shown` that is `root` or one of its parents (links resolved), if any."""
    for d in shown:
        real = Path(os.path.realpath(d))
        if real == root or real in root.parents:
            return d
    return None
