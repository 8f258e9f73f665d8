"""Run a reward check on model-written text in worker processes, each call with a deadline.

A policy writes the text a reward function parses, so it can write text that is ruinous to
parse: `\\boxed{9^{9^{9^9}}}` sends sympy (inside math-verify) into an integer with hundreds of
millions of digits. That work is C code: no signal or thread timeout interrupts it, and run
on the event loop it would freeze every trajectory of the process. Here each call runs in a
worker process (`python -m environments.isolated_call module:function`, JSON lines on its
pipes); a call past its deadline kills that worker only, and raises `CheckTimeout`.
Workers start on first use, are reused, and die with the parent (stdin EOF, or SIGKILL via
PR_SET_PDEATHSIG when the parent is killed).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import signal
import sys
from typing import Any

from sandbox_server.procs import die_with_parent

__all__ = ["CheckTimeout", "IsolatedCall"]


_START_TIMEOUT_S = 300.0  # importing a checker (sympy) on a loaded machine


class CheckTimeout(Exception):
    """The call did not finish within its deadline; its worker was killed."""


class IsolatedCall:
    """`await call(*args)` runs `target` (`"module:function"`, JSON in and out) in a worker process."""

    def __init__(self, target: str, *, workers: int = 2, timeout_s: float = 10.0) -> None:
        module, _, name = target.partition(":")
        if not module or not name:
            raise ValueError(f"target {target!r} must look like 'package.module:function'")
        self.target = target
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(workers)
        self._idle: list[asyncio.subprocess.Process] = []
        self._all: set[asyncio.subprocess.Process] = set()

    async def __call__(self, *args: Any) -> Any:
        async with self._slots:  # waiting for a free worker does not count against the deadline
            proc = self._idle.pop() if self._idle else await self._start()
            assert proc.stdin is not None and proc.stdout is not None  # started with pipes
            try:
                proc.stdin.write(json.dumps({"args": list(args)}).encode() + b"\n")
                line = await asyncio.wait_for(proc.stdout.readline(), self.timeout_s)
            except asyncio.TimeoutError:
                await self._kill(proc)
                raise CheckTimeout(f"{self.target} took over {self.timeout_s:g}s; its worker was killed") from None
            except BaseException:  # cancelled mid-call: the worker is busy with a call nobody waits for
                await asyncio.shield(self._kill(proc))
                raise
            if not line:
                await self._kill(proc)
                raise RuntimeError(f"the worker for {self.target} exited (exit code {proc.returncode})")
            self._idle.append(proc)
        answer = json.loads(line)
        if not answer["ok"]:
            raise RuntimeError(f"{self.target} raised {answer['error']}")
        return answer["value"]

    async def _start(self) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "environments.isolated_call",
            self.target,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,  # errors come back as answers; libraries' chatter stays out
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        self._all.add(proc)
        # The deadline is the call's own: a worker first says it has imported its function.
        assert proc.stdout is not None
        try:
            ready = await asyncio.wait_for(proc.stdout.readline(), _START_TIMEOUT_S)
        except BaseException:
            await asyncio.shield(self._kill(proc))
            raise
        if ready != b"ready\n":
            await self._kill(proc)
            raise RuntimeError(f"a worker for {self.target} could not start (it said {ready[:200]!r})")
        return proc

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        self._all.discard(proc)
        if proc.returncode is None:
            proc.kill()
        await proc.wait()

    async def aclose(self) -> None:
        self._idle.clear()
        await asyncio.gather(*(self._kill(p) for p in list(self._all)))


def _serve(target: str) -> None:
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            answer = {"ok": True, "value": function(*json.loads(line)["args"])}
        except Exception as exc:  # noqa: BLE001 - reported to the caller, the worker stays up
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
