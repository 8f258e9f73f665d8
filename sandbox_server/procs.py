"""The one process runner: a command in its own session, output capped, with a deadline.

Used by sandbox_server (argv is a bwrap command line) and by the local workspace executor
(tools/executor.py). The behaviour both rely on:
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
from collections.abc import Callable
from dataclasses import asdict, dataclass

__all__ = ["ExecResult", "die_with_parent", "kill_process_group", "run_command"]


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when the command was killed for running too long
    output: str  # stdout and stderr interleaved, capped
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def kill_process_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _read_capped(stream: asyncio.StreamReader, cap: int, kept: bytearray) -> bool:
    """Read to EOF into `kept`, up to `cap` bytes; keep draining so the child never blocks. True if cut."""
    truncated = False
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > max(room, 0):
            truncated = True
    return truncated


async def run_command(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    timeout: float,
    max_output_bytes: int,
    stdin: bytes | None = None,
    on_start: Callable[[asyncio.subprocess.Process], None] | None = None,
) -> ExecResult:
    """Run argv in a new session; on timeout (or cancellation) the whole group is killed."""
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    if on_start is not None:
        on_start(proc)
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
    kept = bytearray()
    reader = asyncio.create_task(_read_capped(stream, max_output_bytes, kept))
    timed_out = False
    try:
        async with asyncio.timeout(timeout):
            if stdin is not None:
                assert proc.stdin is not None
                try:
                    proc.stdin.write(stdin)
                    await proc.stdin.drain()
                    proc.stdin.close()
                except (BrokenPipeError, ConnectionResetError):
                    pass
            await proc.wait()
    except TimeoutError:
        timed_out = True
    except BaseException:
        kill_process_group(proc.pid)
        reader.cancel()
        transport.close()
        await proc.wait()
        raise
    kill_process_group(proc.pid)
    await proc.wait()
    try:
        # A process that left the group (no pid namespace around it) may still hold the pipe:
        # keep what arrived instead of waiting for it.
        truncated = await asyncio.wait_for(reader, 2)
    except asyncio.TimeoutError:
        truncated = False
    finally:
        transport.close()
    data = bytes(kept)
    return ExecResult(
        exit_code=None if timed_out else proc.returncode,
        output=data.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        truncated=truncated,
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
