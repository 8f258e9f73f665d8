"""Where a trajectory's tools run.

A tool never decides where it runs: it is handed a `ToolExecutor` (through its
`ToolContext`). `LocalWorkspace` runs commands as local processes in a directory of
their own; the sandbox slots (slots/) implement the same protocol over HTTP, so the
same tool calls reach a remote slot without their callers changing.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NotRequired, Protocol, TypedDict, Unpack, runtime_checkable

from sandbox_server.fileops import FileOpError, PathEscape, Workspace
from sandbox_server.procs import ExecResult, run_command

__all__ = [
    "ExecOptions",
    "ExecResult",
    "FileOpError",
    "ToolExecutor",
    "WorkspaceEscapeError",
    "ToolInfrastructureError",
    "LocalWorkspace",
    "tool_env",
]

# A path resolved outside the trajectory's workspace (or through a symlink). One class for
# both executors: the sandbox client raises the same one for the server's refusals.
WorkspaceEscapeError = PathEscape

# What a tool's process may see of ours: nothing else (API keys, tokens) reaches a tool.
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")


class ToolInfrastructureError(RuntimeError):
    """The place tools run broke (a sandbox died): the trajectory is void, not the model's failure.

    Tool handlers and the registry let it through instead of showing it to the model.
    """


class ExecOptions(TypedDict):
    """How one command runs: the keywords every `ToolExecutor.exec` takes, stated once."""

    timeout: float
    max_output_bytes: int
    stdin: NotRequired[str | None]  # text fed to the command; absent or None: no stdin
    network: NotRequired[bool | None]  # ask for network (or, where a policy decides, None for its default)


@runtime_checkable
class ToolExecutor(Protocol):
    """The seam between tools and the place they act on."""

    @property
    def workspace(self) -> str:
        """Directory commands start in, as the model should see it."""

    @property
    def python(self) -> str:
        """Shell words that start a Python interpreter reading a program from stdin."""

    async def exec(self, command: str, **options: Unpack[ExecOptions]) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes) -> None: ...


def tool_env(home: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a local tool process: an allowlist of ours, HOME set to the workspace."""
    source = os.environ if environ is None else environ
    env = {k: source[k] for k in ENV_ALLOWLIST if k in source}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=home, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    return env


@functools.cache
def _pid_namespace_prefix() -> tuple[str, ...]:
    """`unshare` words that run a command as pid 1 of a new pid namespace, if this machine allows it.

    Everything the command starts (setsid, double forks included) dies when it exits or is
    killed; without it only the command's process group is killed. Probed once per process.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    # --mount-proc: the command's /proc shows only its own processes, not our environment (API keys)
    candidates = (
        (unshare, "--pid", "--fork", "--kill-child", "--mount-proc"),
        (unshare, "--user", "--map-current-user", "--pid", "--fork", "--kill-child", "--mount-proc"),
        (unshare, "--pid", "--fork", "--kill-child"),
    )
    for prefix in candidates:
        try:
            ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return prefix
    return ()


class LocalWorkspace:
    """A directory on this machine; commands run as local processes without isolation.

    Isolation (own uid, namespaces, no network) comes from the sandbox slots, the default; this
    executor is what the explicit `unconfined_tools` opt-out runs (docs/security.md).
    """

    def __init__(self, root: Path, *, python: str | None = None, max_file_bytes: int = 64 * 1024 * 1024) -> None:
        self._root = Path(root).resolve()
        self._root.mkdir(parents=True, exist_ok=True)
        self._python = python or f"{sys.executable} -"
        self._files = Workspace(str(self._root), max_file_bytes=max_file_bytes)

    @property
    def workspace(self) -> str:
        return str(self._root)

    @property
    def python(self) -> str:
        return self._python

    @property
    def root(self) -> Path:
        return self._root

    async def exec(self, command: str, **options: Unpack[ExecOptions]) -> ExecResult:
        stdin = options.get("stdin")  # `network` is not read: a local process has this machine's network
        if "\x00" in command:
            raise FileOpError("the command contains a NUL byte, which bash cannot take; remove it")
        prefix = await asyncio.to_thread(_pid_namespace_prefix)
        return await run_command(
            [*prefix, "bash", "-c", command],
            cwd=str(self._root),
            env=tool_env(str(self._root)),
            timeout=options["timeout"],
            max_output_bytes=options["max_output_bytes"],
            stdin=stdin.encode() if stdin is not None else None,
        )

    # File operations never block (FIFOs are refused) and never follow a symlink out.
    async def read_file(self, path: str) -> bytes:
        return await asyncio.to_thread(self._files.read, path)

    async def write_file(self, path: str, data: bytes) -> None:
        await asyncio.to_thread(self._files.write, path, data)
