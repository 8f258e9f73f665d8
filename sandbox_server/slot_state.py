"""One slot's state on the server, the fixed environment its commands get, and killing all it runs."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_server.bundle import SLOT_PATH
from sandbox_server.fileops import Workspace

__all__ = ["SlotState", "kill_uid", "slot_env"]


@dataclass
class SlotState:
    id: str
    root: Path
    uid: int
    workspace: Workspace
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # at most two file operations of one slot at once: a slot cannot take the whole thread pool
    file_ops: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2))
    procs: set = field(default_factory=set)
    generation: int = 0  # bumped by reset so a caller can tell it got a fresh workspace
    shell: asyncio.Task | None = None  # starting or started SlotShell: the slot's namespace and exec server


def slot_env(python_bin: str | None, workspace_mount: str) -> dict[str, str]:
    """A fixed environment: nothing of the server's leaks in. `python_bin` first on PATH (the local
    backend's interpreter); None in the self-contained runtime, whose slots see the image's tools only."""
    return {
        "PATH": f"{python_bin}:{SLOT_PATH}" if python_bin else SLOT_PATH,
        "HOME": workspace_mount,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (a slot's processes, wherever they went), from a child running as it."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(3):  # a fork bomb may fork between rounds
                try:
                    os.kill(-1, 9)
                except ProcessLookupError:
                    break
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
