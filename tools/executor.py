"""Where a trajectory's tools run.

A tool never decides where it runs: it is handed a `ToolExecutor` (through its
`ToolContext`). `LocalWorkspace` runs commands as local processes in a directory of
their own; the sandbox slots (slots/) implement the same protocol over HTTP, so the
same tool calls reach a remote slot without their callers changing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "ExecResult",
    "ToolExecutor",
    "WorkspaceEscapeError",
    "ToolInfrastructureError",
    "LocalWorkspace",
    "confine",
]


class WorkspaceEscapeError(PermissionError):
    """A path resolved outside the trajectory's workspace."""


class ToolInfrastructureError(RuntimeError):
    """The place tools run broke (a sandbox died): the trajectory is void, not the model's failure.

    Tool handlers and the registry let it through instead of showing it to the model.
    """


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when the command was killed for running too long
    output: str  # stdout and stderr interleaved, capped
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0


@runtime_checkable
class ToolExecutor(Protocol):
    """The seam between tools and the place they act on."""

    @property
    def workspace(self) -> str:
        """Directory commands start in, as the model should see it."""

    @property
    def python(self) -> str:
        """Shell words that start a Python interpreter reading a program from stdin."""

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        max_output_bytes: int,
        stdin: str | None = None,
        network: bool = False,
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes) -> None: ...


def confine(root: Path, path: str) -> Path:
    """Resolve `path` (relative to `root`, or absolute) and refuse it if it leaves `root`.

    Symlinks are resolved first, so a link pointing outside is refused too.
    """
    root = root.resolve()
    candidate = Path(path)
    target = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if target != root and not target.is_relative_to(root):
        raise WorkspaceEscapeError(
            f"path {path!r} resolves outside the workspace {str(root)!r}; use a path inside it"
        )
    return target


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Read to EOF, keeping the first `cap` bytes; keep draining so the child never blocks."""
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > max(room, 0):
            truncated = True
    return bytes(kept), truncated


def kill_process_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_process_group(
    argv: list[str],
    *,
    cwd: str,
    timeout: float,
    max_output_bytes: int,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> ExecResult:
    """Run argv in a new session; on timeout the whole process group is killed."""
    started = time.monotonic()
    # Output goes through a pipe we own rather than asyncio's: asyncio's wait() would also
    # wait for every holder of the pipe, so a backgrounded child would stall a finished command.
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,  # its own process group, so a timeout kills grandchildren too
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader(limit=2**20)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream), os.fdopen(read_fd, "rb", buffering=0)
        )
    except BaseException:  # cancelled between spawn and the guarded wait: the command must not outlive us
        kill_process_group(proc.pid)
        await proc.wait()
        raise
    reader = asyncio.create_task(_read_capped(stream, max_output_bytes))
    timed_out = False
    try:
        if stdin is not None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(stdin.encode())
                await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass
        await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        timed_out = True
    except BaseException:
        kill_process_group(proc.pid)
        reader.cancel()
        transport.close()
        await proc.wait()
        raise
    # Kill what is left of the group either way: a background child of a finished
    # command would otherwise hold the output pipe open and outlive the trajectory.
    kill_process_group(proc.pid)
    await proc.wait()
    try:
        data, truncated = await asyncio.wait_for(reader, 5)
    except asyncio.TimeoutError:
        reader.cancel()
        data, truncated = b"", True
    finally:
        transport.close()
    return ExecResult(
        exit_code=None if timed_out else proc.returncode,
        output=data.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        truncated=truncated,
        duration_s=time.monotonic() - started,
    )


class LocalWorkspace:
    """A directory on this machine; commands run as local processes without isolation.

    Isolation (namespaces, no network) comes from the sandbox slots; this executor is the
    quick path for trusted tasks such as GSM8k's arithmetic snippets.
    """

    def __init__(self, root: Path, *, python: str | None = None) -> None:
        self._root = Path(root).resolve()
        self._root.mkdir(parents=True, exist_ok=True)
        self._python = python or f"{sys.executable} -"

    @property
    def workspace(self) -> str:
        return str(self._root)

    @property
    def python(self) -> str:
        return self._python

    @property
    def root(self) -> Path:
        return self._root

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        max_output_bytes: int,
        stdin: str | None = None,
        network: bool = False,
    ) -> ExecResult:
        return await run_process_group(
            ["bash", "-c", command],
            cwd=str(self._root),
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            stdin=stdin,
        )

    async def read_file(self, path: str) -> bytes:
        target = confine(self._root, path)
        return await asyncio.to_thread(target.read_bytes)

    async def write_file(self, path: str, data: bytes) -> None:
        target = confine(self._root, path)

        def _write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

        await asyncio.to_thread(_write)
