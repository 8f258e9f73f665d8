"""Start and stop one sandbox_server as a local child process."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from sandbox_server.procs import die_with_parent

__all__ = ["SandboxProcess", "SandboxStartError", "start_sandbox_process"]


class SandboxStartError(RuntimeError):
    """A sandbox_server did not come up."""


@dataclass
class SandboxProcess:
    proc: asyncio.subprocess.Process
    host: str
    port: int
    token: str
    data_dir: Path
    isolation: bool

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM (the server kills its running commands), then SIGKILL after `grace_s`."""
        if self.proc.returncode is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                await asyncio.wait_for(self.proc.wait(), grace_s)
            except ProcessLookupError:
                pass
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self.proc.wait()
        # A server that died on its own (SIGKILL, OOM) leaves its slot processes behind in its
        # session; they are ours to end, not the next run's.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


async def start_sandbox_process(
    *,
    data_dir: Path,
    slots: int,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    python: str | None = None,
    bwrap: str = "bwrap",
    startup_timeout_s: float = 20.0,
    extra_args: list[str] | None = None,
) -> SandboxProcess:
    token = token or secrets.token_urlsafe(24)
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        python or sys.executable,
        "-m",
        "sandbox_server",
        "--host",
        host,
        "--port",
        str(port),
        "--slots",
        str(slots),
        "--data-dir",
        str(data_dir),
        "--bwrap",
        bwrap,
        "--remove-data-dir",
        *(extra_args or []),
    ]
    # The token goes in through a pipe: never in `ps` (argv) nor in /proc/<pid>/environ.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1"}
    token_r, token_w = os.pipe()
    argv += ["--token-fd", str(token_r)]
    log = open(data_dir / "server.log", "ab")
    try:
        os.write(token_w, token.encode())
        os.close(token_w)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=(token_r,),
            # If this process dies (even by SIGKILL) the server stops too, and bwrap with it.
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
    finally:
        log.close()
        os.close(token_r)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), startup_timeout_s)
        info = json.loads(line)
    except BaseException as exc:
        # Also on cancellation: a server nobody will ever stop must not be left running.
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if not isinstance(exc, (asyncio.TimeoutError, json.JSONDecodeError, ValueError)):
            raise
        tail = (data_dir / "server.log").read_text(errors="replace")[-2000:]
        raise SandboxStartError(
            f"sandbox_server did not report its port within {startup_timeout_s}s (exit code {proc.returncode}); "
            f"its log ends with:\n{tail}"
        ) from None
    return SandboxProcess(proc, host, int(info["port"]), token, data_dir, bool(info.get("isolation")))
