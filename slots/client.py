"""HTTP client of one sandbox_server, and the slot (one workspace on one server) it is called for."""

from __future__ import annotations

import asyncio
import base64
import enum
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Unpack

import aiohttp

from sandbox_server.fileops import error_for
from tools.executor import ExecOptions, ExecResult, ToolInfrastructureError

__all__ = ["SandboxAddress", "SandboxClient", "SandboxError", "SandboxUnavailable", "Slot", "SlotState", "exec_result"]


class SandboxError(RuntimeError):
    """The sandbox answered with an error (bad request, isolation unavailable, ...)."""

    def __init__(self, message: str, *, status: int = 0, kind: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class SandboxUnavailable(SandboxError, ToolInfrastructureError):
    """The sandbox did not answer: it died, or the network between us did. Infrastructure, not the model."""


@dataclass(frozen=True)
class SandboxAddress:
    name: str  # stable id given by the backend (process pid, Nomad allocation, Modal sandbox name)
    url: str
    token: str


class SlotState(enum.Enum):
    FREE = "free"
    BUSY = "busy"
    RESETTING = "resetting"
    DEAD = "dead"


@dataclass(eq=False)
class Slot:
    id: str  # "<sandbox name>/<index>"
    sandbox: SandboxAddress
    index: str  # the slot's id on its server
    workspace: str
    state: SlotState = SlotState.FREE


def exec_result(data: dict[str, Any]) -> ExecResult:
    return ExecResult(
        exit_code=data["exit_code"],
        output=data["output"],
        timed_out=bool(data["timed_out"]),
        truncated=bool(data["truncated"]),
        duration_s=float(data["duration_s"]),
    )


def raise_for_error(status: int, kind: str, message: str) -> None:
    # File-op refusals come back as the exceptions the local workspace raises for them.
    if (exc := error_for(kind, message)) is not None:
        raise exc
    raise SandboxError(message, status=status, kind=kind)


class SandboxClient:
    """Talks to one server; shares the caller's aiohttp session."""

    def __init__(
        self, address: SandboxAddress, session: aiohttp.ClientSession, *, request_margin_s: float = 30.0
    ) -> None:
        self.address = address
        self._session = session
        self._headers = {"Authorization": f"Bearer {address.token}"}
        self._margin = request_margin_s

    async def _request(self, method: str, path: str, *, timeout: float, **kw) -> tuple[int, bytes, str]:
        try:
            async with self._session.request(
                method,
                self.address.url + path,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
                **kw,
            ) as resp:
                return resp.status, await resp.read(), resp.content_type
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError, aiohttp.ClientPayloadError) as exc:
            raise SandboxUnavailable(
                f"sandbox {self.address.name} at {self.address.url} did not answer {method} {path}: {exc!r}"
            ) from exc

    async def _json(self, method: str, path: str, *, timeout: float, **kw) -> Any:
        status, body, ctype = await self._request(method, path, timeout=timeout, **kw)
        if status >= 400:
            self._raise(status, body)
        return json.loads(body)

    def _raise(self, status: int, body: bytes) -> None:
        try:
            err = json.loads(body)
            raise_for_error(status, err.get("kind", ""), err.get("error", ""))
        except (json.JSONDecodeError, AttributeError):
            pass
        if status == 401:
            raise SandboxError(f"sandbox {self.address.name} refused our token (401)", status=401, kind="unauthorized")
        raise SandboxError(f"sandbox {self.address.name} answered {status}: {body[:300]!r}", status=status)

    async def health(self, timeout: float = 5.0) -> dict:
        return await self._json("GET", "/health", timeout=timeout)

    async def wait_ready(
        self, deadline_s: float, alive: Callable[[], Awaitable[bool]] | None = None, *, poll_s: float = 0.1
    ) -> dict:
        """`/health` once the server answers, retried until `deadline_s` has passed.

        Platforms report a sandbox running when its process starts (a Nomad allocation, a Modal
        tunnel, a container), not when the server listens: the first calls may be refused.
        `alive` is the platform's view; once it says the sandbox is gone, waiting longer is pointless.
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        last: Exception | None = None
        while True:
            left = end - loop.time()
            if left <= 0:
                break
            try:
                return await self.health(timeout=max(0.5, min(5.0, left)))
            except SandboxUnavailable as exc:
                last = exc
            except SandboxError as exc:
                if exc.status not in (502, 503, 504):  # a proxy in front (Modal's tunnel) before the server is up
                    raise
                last = exc
            if alive is not None and not await alive():
                raise SandboxUnavailable(
                    f"sandbox {self.address.name} stopped before its server answered /health (last: {last})"
                )
            await asyncio.sleep(min(poll_s, max(0.0, end - loop.time())))
            poll_s = min(poll_s * 2, 1.0)
        raise SandboxUnavailable(
            f"sandbox {self.address.name} at {self.address.url} did not answer /health within {deadline_s:g}s "
            f"(last: {last}); raise the pool's ready_timeout_s or see the sandbox's log"
        )

    async def exec(self, slot: str, command: str, **options: Unpack[ExecOptions]) -> ExecResult:
        body = {"stdin": None, "network": False, **options, "command": command}  # the server's defaults, sent
        wait_s = options["timeout"] + self._margin
        return exec_result(await self._json("POST", f"/slots/{slot}/exec", json=body, timeout=wait_s))

    async def reset(self, slot: str, timeout: float = 60.0) -> dict:
        return await self._json("POST", f"/slots/{slot}/reset", timeout=timeout)

    async def interrupt(self, slot: str, timeout: float = 30.0) -> dict:
        """Kill the slot's running and queued commands, keeping its workspace."""
        return await self._json("POST", f"/slots/{slot}/interrupt", timeout=timeout)

    async def read_file(self, slot: str, path: str, timeout: float = 60.0) -> bytes:
        status, body, _ = await self._request("GET", f"/slots/{slot}/file", params={"path": path}, timeout=timeout)
        if status >= 400:
            self._raise(status, body)
        return body

    async def write_file(self, slot: str, path: str, data: bytes, timeout: float = 60.0) -> None:
        await self._json("PUT", f"/slots/{slot}/file", params={"path": path}, data=data, timeout=timeout)

    async def list_artifacts(self, slot: str, path: str = ".", timeout: float = 60.0) -> dict:
        return await self._json("GET", f"/slots/{slot}/artifacts", params={"path": path}, timeout=timeout)

    async def archive(self, slot: str, path: str = ".", timeout: float = 120.0) -> bytes:
        status, body, _ = await self._request("GET", f"/slots/{slot}/archive", params={"path": path}, timeout=timeout)
        if status >= 400:
            self._raise(status, body)
        return body

    async def batch(self, calls: list[dict], *, timeout: float):
        """Yield (index, ok, payload) lines as the server finishes each call."""
        try:
            async with self._session.post(
                self.address.url + "/batch",
                json={"calls": calls},
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout + self._margin),
            ) as resp:
                if resp.status >= 400:
                    self._raise(resp.status, await resp.read())
                async for raw in resp.content:
                    if raw.strip():
                        yield json.loads(raw)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError, aiohttp.ClientPayloadError) as exc:
            raise SandboxUnavailable(
                f"sandbox {self.address.name} at {self.address.url} broke off a batch: {exc!r}"
            ) from exc


def decode_b64(payload: dict) -> bytes:
    return base64.b64decode(payload["data_b64"])
