"""Bubblewrap isolation for one command in one slot.

Each command gets its own mount, pid, ipc, uts, cgroup and (unless the call allows it)
network namespace. The filesystem it sees is the system directories read-only, the
interpreter's prefix read-only, a private /tmp, the slot's workspace read-write at a
fixed path and, if configured, the shared cache. Nothing else of the host is visible.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["IsolationStatus", "Sandboxing", "probe_bwrap"]

# System directories every command may read. Merged-/usr systems have /bin -> usr/bin;
# those links are recreated as links so the same paths resolve inside.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt")


@dataclass(frozen=True)
class IsolationStatus:
    available: bool
    bwrap: str | None
    reason: str | None = None


async def probe_bwrap(bwrap: str) -> IsolationStatus:
    """Run a trivial command in a full set of new namespaces; report why it failed if it did."""
    path = shutil.which(bwrap)
    if path is None:
        return IsolationStatus(False, None, f"bubblewrap executable {bwrap!r} not found; install the 'bubblewrap' package")
    argv = [path, "--unshare-all", "--cap-drop", "ALL", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    except (OSError, asyncio.TimeoutError) as exc:
        return IsolationStatus(False, path, f"bubblewrap could not start: {exc}")
    if proc.returncode != 0:
        return IsolationStatus(
            False,
            path,
            "bubblewrap cannot create namespaces here "
            f"({err.decode(errors='replace').strip()}); run as root or enable unprivileged user namespaces",
        )
    return IsolationStatus(True, path)


class Sandboxing:
    """Builds the bwrap command line for a slot."""

    def __init__(
        self,
        *,
        bwrap: str,
        data_dir: Path,
        workspace_mount: str,
        cache_dir: Path | None,
        cache_mount: str,
        extra_ro: list[str],
    ) -> None:
        self.bwrap = bwrap
        self.data_dir = data_dir
        self.workspace_mount = workspace_mount
        self.cache_dir = cache_dir
        self.cache_mount = cache_mount
        ro = list(SYSTEM_DIRS) + extra_ro
        self._ro: list[str] = []
        for p in ro:
            if p not in self._ro:
                self._ro.append(p)

    def argv(self, workspace: Path, command: list[str], *, network: bool) -> list[str]:
        # --cap-drop ALL: bwrap started by root otherwise hands root's capabilities to the
        # command, which could then remount the read-only binds read-write (host escape).
        args = [self.bwrap, "--unshare-all", "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        if network:
            args.append("--share-net")
        # The private /tmp goes first: binds made after it stay visible, so an interpreter
        # that lives under /tmp (a venv in a checkout there) is still reachable.
        args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        covered: list[str] = []
        for p in self._ro:
            if os.path.islink(p):
                args += ["--symlink", os.readlink(p), p]
            elif os.path.exists(p):
                args += ["--ro-bind", p, p]
                covered.append(p)
        # If the server's own data lives under a visible directory (e.g. /opt in the image),
        # cover it so one slot cannot read another's workspace or the server's token.
        data = str(self.data_dir)
        if any(data == c or data.startswith(c.rstrip("/") + "/") for c in covered):
            args += ["--tmpfs", data]
        args += ["--bind", str(workspace), self.workspace_mount]
        if self.cache_dir is not None:
            args += ["--bind", str(self.cache_dir), self.cache_mount]
        # bwrap builds the root as a tmpfs; make it read-only so the workspace, /tmp and the
        # cache are the only writable places.
        args += ["--remount-ro", "/", "--chdir", self.workspace_mount, "--"]
        return args + command
