"""A `ToolExecutor` over one slot, and the batcher that groups calls arriving together."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import shlex
from typing import Any, Unpack

from pydantic import BaseModel, Field, field_validator

from slots.client import SandboxClient, SandboxUnavailable, Slot, decode_b64, exec_result, raise_for_error
from tools.executor import ExecOptions, ExecResult

__all__ = ["ExecPolicy", "SandboxBatcher", "SlotExecutor", "python_command"]


def python_command(interpreter: str | None) -> str:
    """The command the python tool runs (its program on stdin) given the interpreter a sandbox
    reports; an image without python3 (its /health says null) gets a command saying so."""
    if interpreter:
        return f"{shlex.quote(interpreter)} -"
    return "echo 'python: this sandbox image has no python3 on its PATH; use the terminal tool' >&2; exit 127"


log = logging.getLogger(__name__)


class SandboxBatcher:
    """Sends the calls made to one sandbox in the same event-loop turn as one /batch.

    A lone call goes out at once (the next turn of the loop); with `window_s` > 0 calls wait
    that long for company instead. The server answers line by line as calls finish, so a long
    command in a batch does not delay the quick ones.
    """

    def __init__(self, client: SandboxClient, *, window_s: float = 0.0) -> None:
        self.client = client
        self.window_s = window_s
        self._pending: list[tuple[dict, asyncio.Future, float]] = []
        self._flusher: asyncio.Handle | None = None
        self._inflight: set[asyncio.Task] = set()
        self.batches_sent = 0
        self.calls_sent = 0

    async def call(self, call: dict, *, timeout: float) -> dict:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((call, fut, timeout))
        if self._flusher is None:
            # The next turn of the loop (after the other calls of this turn, e.g. a gather of tool
            # calls, have joined), or after the window.
            loop = asyncio.get_running_loop()
            self._flusher = (
                loop.call_later(self.window_s, self._flush) if self.window_s > 0 else loop.call_soon(self._flush)
            )
        line = await fut
        if not line["ok"]:
            raise_for_error(line.get("status", 0), line.get("kind", ""), line.get("error", ""))
        return line["result"]

    def _flush(self) -> None:
        batch, self._pending, self._flusher = self._pending, [], None
        task = asyncio.create_task(self._send(batch))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _send(self, batch: list[tuple[dict, asyncio.Future, float]]) -> None:
        self.batches_sent += 1
        self.calls_sent += len(batch)
        live = [(c, f, t) for c, f, t in batch if not f.cancelled()]
        try:
            async for line in self.client.batch(
                [c for c, _, _ in live], timeout=max((t for _, _, t in live), default=1)
            ):
                fut = live[line["index"]][1]
                if not fut.done():
                    fut.set_result(line)
        except Exception as exc:  # noqa: BLE001 - handed to every waiting caller below
            for _, fut, _ in live:
                if not fut.done():
                    fut.set_exception(exc)
        finally:
            # Also on cancellation (the pool is closing): nobody may wait forever.
            for _, fut, _ in live:
                if not fut.done():
                    fut.set_exception(
                        SandboxUnavailable(
                            f"sandbox {self.client.address.name} ended a batch without this call's result"
                        )
                    )

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
            for _, fut, _ in self._pending:
                if not fut.done():
                    fut.set_exception(SandboxUnavailable(f"sandbox {self.client.address.name} is closing"))
            self._pending = []
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not interrupt an abandoned command: %s", task.exception())


class ExecPolicy(BaseModel):
    """What every command of one trajectory runs with, decided by the env for its item, never by a tool."""

    network: bool = Field(False, description="Commands get the sandbox host's network (else none, loopback included)")
    env: dict[str, str] = Field(default_factory=dict, description="Variables exported before each command")
    verifier_network: bool | None = Field(
        None, description="The verifier's commands (`verify_exec`) get network (None: as `network`)"
    )
    verifier_as_root: bool = Field(
        False,
        description="The verifier's commands run as the image's root; only a server started with "
        "--allow-root-commands (container backends) accepts it, others refuse",
    )

    @field_validator("env")
    @classmethod
    def _names(cls, env: dict[str, str]) -> dict[str, str]:
        bad = [k for k in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"not shell variable names: {bad}; use letters, digits and _")
        return env

    def prefix(self) -> str:
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env.items())


class SlotExecutor:
    """Runs a trajectory's tools in its slot; paths and commands see the slot's workspace."""

    def __init__(
        self, slot: Slot, batcher: SandboxBatcher, *, python: str = "python -", policy: ExecPolicy | None = None
    ) -> None:
        self.slot = slot
        self._batcher = batcher
        self._python = python
        self.policy = policy or ExecPolicy()
        self._interrupt: asyncio.Task | None = None

    @property
    def workspace(self) -> str:
        return self.slot.workspace

    @property
    def python(self) -> str:
        return self._python

    async def exec(self, command: str, **options: Unpack[ExecOptions]) -> ExecResult:
        """`network` None or absent: the trajectory's policy; a caller may ask for less, never for more."""
        timeout, network = options["timeout"], options.get("network")
        if network and not self.policy.network:
            raise PermissionError("this trajectory's policy gives its commands no network; the env decides that")
        network = self.policy.network if network is None else network
        call = self._exec_call(command, timeout, options["max_output_bytes"], options.get("stdin"), network)
        if self._interrupt is not None:
            # A command sent after an abandoned one runs once that one is gone, never behind it.
            await asyncio.wait([self._interrupt])
        try:
            return exec_result(await self._batcher.call(call, timeout=timeout))
        except asyncio.CancelledError:
            # The caller gave up (time budget, cancelled trajectory): the command must not run on
            # and hold the slot, e.g. in front of the verifier's commands.
            if self._interrupt is None or self._interrupt.done():
                self._interrupt = asyncio.ensure_future(self._batcher.client.interrupt(self.slot.index))
                self._interrupt.add_done_callback(_log_failure)
            raise

    def _exec_call(
        self,
        command: str,
        timeout: float,
        max_output_bytes: int,
        stdin: str | None,
        network: bool,
        *,
        as_root: bool = False,
    ) -> dict[str, Any]:
        call: dict[str, Any] = {
            "slot": self.slot.index,
            "op": "exec",
            "command": self.policy.prefix() + command,
            "timeout": timeout,
            "max_output_bytes": max_output_bytes,
            "stdin": stdin,
            "network": network,
        }
        if as_root:
            call["as_root"] = True
        return call

    async def verify_exec(
        self, command: str, *, timeout: float, max_output_bytes: int, stdin: str | None = None
    ) -> ExecResult:
        """A command of the env's verifier, as the policy says the verifier runs (its network, root or not).

        The agent's tools call `exec` only; nothing they are given reaches this (tests/terminal_tasks/
        test_docker_root_verifier.py plays a policy that asks every tool for root).
        """
        network = self.policy.network if self.policy.verifier_network is None else self.policy.verifier_network
        call = self._exec_call(command, timeout, max_output_bytes, stdin, network, as_root=self.policy.verifier_as_root)
        if self._interrupt is not None:
            await asyncio.wait([self._interrupt])
        return exec_result(await self._batcher.call(call, timeout=timeout))

    async def read_file(self, path: str) -> bytes:
        result = await self._batcher.call({"slot": self.slot.index, "op": "read_file", "path": path}, timeout=60)
        return decode_b64(result)

    async def write_file(self, path: str, data: bytes) -> None:
        call = {"slot": self.slot.index, "op": "write_file", "path": path, "data_b64": base64.b64encode(data).decode()}
        await self._batcher.call(call, timeout=60)
