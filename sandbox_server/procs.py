"""Run one command as its own process group, capped and with a deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import asdict, dataclass

__all__ = ["ExecOutcome", "run_command"]


@dataclass(frozen=True)
class ExecOutcome:
    exit_code: int | None  # None when killed for running too long
    output: str
    timed_out: bool
    truncated: bool
    duration_s: float

    def to_json(self) -> dict:
        return asdict(self)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > max(room, 0):
            truncated = True  # keep draining so the child never blocks on a full pipe
    return bytes(kept), truncated


async def run_command(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    timeout: float,
    max_output_bytes: int,
    stdin: bytes | None,
    on_start=None,
) -> ExecOutcome:
    """Run argv in a new session; on timeout (or cancellation) the whole group is killed.

    Under bwrap the command is pid 1's child in a new pid namespace started with
    --die-with-parent, so killing bwrap's group takes every descendant with it.
    """
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    if on_start is not None:
        on_start(proc)
    assert proc.stdout is not None
    reader = asyncio.create_task(_read_capped(proc.stdout, max_output_bytes))
    timed_out = False
    try:
        if stdin is not None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass
        await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        timed_out = True
    except BaseException:
        _killpg(proc.pid)
        reader.cancel()
        await proc.wait()
        raise
    # A background child of a finished command would hold the pipe open: end the group.
    _killpg(proc.pid)
    await proc.wait()
    try:
        data, truncated = await asyncio.wait_for(reader, 5)
    except asyncio.TimeoutError:
        reader.cancel()
        data, truncated = b"", True
    return ExecOutcome(
        exit_code=None if timed_out else proc.returncode,
        output=data.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        truncated=truncated,
        duration_s=round(time.monotonic() - started, 4),
    )
