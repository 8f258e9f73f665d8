"""The one process runner: a command in its own session, output capped, with a deadline.

Used by sandbox_server (a command forked by the slot's exec server, or a bwrap command line)
and by the local workspace executor (tools/executor.py). How the process starts is a `Spawn`
(a local subprocess by default); the behaviour all rely on:
- the command is done when its main process exits, even if a backgrounded child still
  holds the output pipe (we own the pipe, so nothing waits for its other holders);
- whatever is left of the process group is killed then, on timeout and on cancellation.
  Escapes from the group (setsid, double fork) are the caller's to contain: a pid
  namespace (bwrap's init, `unshare --pid --fork`) dies with its first process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Child", "ExecResult", "Spawn", "die_with_parent", "kill_process_group", "run_command", "spawn_local"]


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when the command was killed for running too long
    output: str  # stdout and stderr interleaved, capped
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    def to_json(self) -> dict:
        return {
            "exit_code": self.exit_code,
            "output": self.output,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
            "duration_s": self.duration_s,
        }


def kill_process_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Child(Protocol):
    """A started command as the runner sees it."""

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def kill(self) -> None:
        """SIGKILL the command and what it started (its process group, or its pid namespace)."""


# (argv, cwd, env, stdout_fd, stdin_fd or None) -> a started Child; the fds are the caller's to close.
Spawn = Callable[[list[str], str, dict[str, str], int, "int | None"], Awaitable[Child]]


class _LocalChild:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def wait(self) -> int:
        return await self.proc.wait()

    def kill(self) -> None:
        kill_process_group(self.proc.pid)


async def spawn_local(argv: list[str], cwd: str, env: dict[str, str], stdout_fd: int, stdin_fd: int | None) -> Child:
    """A plain subprocess in a new session (its own process group, no controlling terminal)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=stdin_fd if stdin_fd is not None else asyncio.subprocess.DEVNULL,
        stdout=stdout_fd,
        stderr=stdout_fd,
        start_new_session=True,
    )
    return _LocalChild(proc)


async def _feed(fd: int, data: bytes) -> None:
    """Write `data` to the command's stdin pipe and close it; a command that stops reading is fine."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), os.fdopen(fd, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    try:
        writer.write(data)
        await writer.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        transport.close()


class _Output:
    """The command's output pipe, read by the event loop as it comes: up to `cap` bytes kept, the rest
    drained so the command never blocks on a full pipe. A callback, not a stream and a task: one
    wake-up per chunk and nothing else per command."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap = fd, cap
        self.kept = bytearray()
        self.truncated = False
        self.loop = asyncio.get_running_loop()
        self.eof: asyncio.Future[None] = self.loop.create_future()
        os.set_blocking(fd, False)
        self.loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        if len(chunk) > max(room, 0):
            self.truncated = True

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        if not self.eof.done():
            self.eof.set_result(None)


async def run_command(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    timeout: float,
    max_output_bytes: int,
    stdin: bytes | None = None,
    on_start: Callable[[Child], None] | None = None,
    spawn: Spawn | None = None,
) -> ExecResult:
    """Run argv (by default in a new session); on timeout (or cancellation) all of it is killed."""
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    stdin_r, stdin_w = os.pipe() if stdin is not None else (None, None)
    try:
        proc = await (spawn or spawn_local)(argv, cwd, env, write_fd, stdin_r)
    except BaseException:
        os.close(read_fd)
        if stdin_w is not None:
            os.close(stdin_w)
        raise
    finally:
        os.close(write_fd)
        if stdin_r is not None:
            os.close(stdin_r)
    if on_start is not None:
        on_start(proc)
    out = _Output(read_fd, max_output_bytes)
    timed_out = False
    try:
        async with asyncio.timeout(timeout):
            if stdin_w is not None:
                fd, stdin_w = stdin_w, None
                await _feed(fd, stdin)  # type: ignore[arg-type]  # not None when the pipe exists
            await proc.wait()
    except TimeoutError:
        timed_out = True
    except BaseException:
        proc.kill()
        out.close()
        await proc.wait()
        raise
    finally:
        if stdin_w is not None:
            os.close(stdin_w)
    proc.kill()
    await proc.wait()
    try:
        if not out.eof.done():
            # A process that left the group (no pid namespace around it) may still hold the pipe:
            # keep what arrived instead of waiting for it.
            await asyncio.wait([out.eof], timeout=2)
    finally:
        out.close()
    return ExecResult(
        exit_code=None if timed_out else proc.returncode,
        output=out.kept.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        truncated=out.truncated,
        duration_s=round(time.monotonic() - started, 4),
    )


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when the process that started it dies, even by SIGKILL.

    Linux only (PR_SET_PDEATHSIG); elsewhere it does nothing. If the parent is already gone
    by the time the child runs, the child ends itself.
    """
    import ctypes  # noqa: PLC0415 - only where a child is started this way

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None
    parent = os.getpid()

    def arm() -> None:
        prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return arm
