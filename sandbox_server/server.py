"""The sandbox HTTP server: N slots, one workspace each, one call at a time per slot.

Endpoints (all need `Authorization: Bearer <token>`; JSON unless noted):
  GET  /health                          isolation status, slots, interpreter
  POST /slots/{slot}/exec               {command, timeout, max_output_bytes, stdin?, network?, require_isolation?}
  POST /slots/{slot}/reset              kill what runs in the slot, empty its workspace
  GET  /slots/{slot}/file?path=P        raw bytes
  PUT  /slots/{slot}/file?path=P        raw bytes in the body
  GET  /slots/{slot}/artifacts?path=D   list files under D
  GET  /slots/{slot}/archive?path=D     tar.gz of D
  POST /batch                           {calls: [{slot, op: exec|read_file|write_file, ...}]}
                                        answered as NDJSON, one line per call as it finishes
Errors come back as {"error": message, "kind": kind} with a 4xx/5xx status.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import io
import json
import os
import shutil
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from aiohttp import web
from pydantic import BaseModel, Field

from sandbox_server.isolation import IsolationStatus, Sandboxing, probe_bwrap
from sandbox_server.procs import run_command

__all__ = ["ServerConfig", "SandboxServer", "build_app"]

API_VERSION = 1


class ServerConfig(BaseModel):
    slots: int = Field(4, ge=1, le=256, description="Number of slots (workspaces) this server holds")
    data_dir: str = Field(..., description="Directory holding the slots' workspaces and the shared cache")
    bwrap: str = Field("bwrap", description="bubblewrap executable")
    workspace_mount: str = Field("/workspace", description="Where a slot's workspace appears inside the sandbox")
    cache_mount: str | None = Field(
        "/cache",
        description="Where the server-wide shared cache appears (read-write, e.g. bare git repos); None: no cache",
    )
    max_output_bytes: int = Field(1_000_000, gt=0, description="Upper bound on one command's captured output")
    max_timeout_s: float = Field(3600.0, gt=0)
    max_file_bytes: int = Field(64 * 1024 * 1024, gt=0)
    extra_ro_paths: list[str] = Field(default_factory=list, description="More host paths to show read-only")


class RequestError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass
class SlotState:
    id: str
    root: Path
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    procs: set = field(default_factory=set)
    generation: int = 0  # bumped by reset so a caller can tell it got a fresh workspace


def _env_for(python_bin: str, workspace_mount: str) -> dict[str, str]:
    # A fixed environment: nothing of the server's (its token included) leaks in.
    return {
        "PATH": f"{python_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": workspace_mount,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


class SandboxServer:
    def __init__(self, config: ServerConfig, token: str) -> None:
        if not token:
            raise ValueError("the sandbox server needs a non-empty bearer token")
        self.config = config
        self._token = token.encode()
        self.data_dir = Path(config.data_dir).resolve()
        self.isolation = IsolationStatus(False, None, "not probed yet")
        self.slots: dict[str, SlotState] = {}
        python_prefix = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
        self._python_bin = str(Path(sys.executable).parent)
        self.cache_dir = self.data_dir / "cache" if config.cache_mount else None
        self.sandboxing = Sandboxing(
            bwrap=config.bwrap,
            data_dir=self.data_dir,
            workspace_mount=config.workspace_mount,
            cache_dir=self.cache_dir,
            cache_mount=config.cache_mount or "",
            extra_ro=sorted(python_prefix) + config.extra_ro_paths,
        )

    async def start(self) -> None:
        self.isolation = await probe_bwrap(self.config.bwrap)
        if self.isolation.available:
            self.sandboxing.bwrap = self.isolation.bwrap or self.config.bwrap
        (self.data_dir / "slots").mkdir(parents=True, exist_ok=True)
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.config.slots):
            root = self.data_dir / "slots" / str(i)
            await asyncio.to_thread(shutil.rmtree, root, True)
            root.mkdir(parents=True)
            self.slots[str(i)] = SlotState(str(i), root)

    async def stop(self) -> None:
        for slot in self.slots.values():
            self._kill_slot(slot)

    # -- helpers -------------------------------------------------------------------------
    def _slot(self, slot_id: str) -> SlotState:
        slot = self.slots.get(slot_id)
        if slot is None:
            raise RequestError(404, "unknown_slot", f"no slot {slot_id!r}; this server has slots 0..{len(self.slots) - 1}")
        return slot

    def _kill_slot(self, slot: SlotState) -> None:
        for proc in list(slot.procs):
            try:
                os.killpg(proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass

    def resolve(self, slot: SlotState, path: str, *, must_exist: bool = False) -> Path:
        """Map a path as the sandbox sees it to the host, refusing anything outside the workspace."""
        if not isinstance(path, str) or not path or "\x00" in path:
            raise RequestError(400, "bad_request", "'path' must be a non-empty string")
        p = PurePosixPath(path)
        mount = PurePosixPath(self.config.workspace_mount)
        if p.is_absolute():
            if p != mount and mount not in p.parents:
                raise RequestError(
                    403, "path_escape", f"path {path!r} is outside the workspace {str(mount)!r}; use a path inside it"
                )
            p = p.relative_to(mount)
        if ".." in p.parts:
            raise RequestError(403, "path_escape", f"path {path!r} contains '..'; use a path inside the workspace")
        root = slot.root.resolve()
        target = (root / p).resolve()  # follows symlinks: one pointing outside is refused below
        if target != root and not target.is_relative_to(root):
            raise RequestError(403, "path_escape", f"path {path!r} leads outside the workspace (through a symlink)")
        if must_exist and not target.exists():
            raise RequestError(404, "not_found", f"file not found: {path!r}")
        return target

    # -- operations ------------------------------------------------------------------------
    async def exec(self, slot: SlotState, body: dict) -> dict:
        command = body.get("command")
        if not isinstance(command, str) or not command:
            raise RequestError(400, "bad_request", "'command' must be a non-empty string")
        try:
            timeout = float(body.get("timeout", 30))
            cap = int(body.get("max_output_bytes", 100_000))
        except (TypeError, ValueError):
            raise RequestError(400, "bad_request", "'timeout' and 'max_output_bytes' must be numbers") from None
        timeout = max(0.05, min(timeout, self.config.max_timeout_s))
        cap = max(1, min(cap, self.config.max_output_bytes))
        stdin = body.get("stdin")
        if stdin is not None and not isinstance(stdin, str):
            raise RequestError(400, "bad_request", "'stdin' must be a string")
        network = bool(body.get("network", False))
        require_isolation = body.get("require_isolation", True) is not False
        if self.isolation.available:
            argv = self.sandboxing.argv(slot.root, ["bash", "-c", command], network=network)
            cwd = str(slot.root)
        elif require_isolation:
            raise RequestError(
                503,
                "isolation_unavailable",
                f"this sandbox cannot isolate commands ({self.isolation.reason}); refusing to run unsandboxed. "
                "Fix bubblewrap on the sandbox host, or send require_isolation=false for trusted commands.",
            )
        else:
            argv, cwd = ["bash", "-c", command], str(slot.root)
        async with slot.lock:
            outcome = await run_command(
                argv,
                cwd=cwd,
                env=_env_for(self._python_bin, self.config.workspace_mount if self.isolation.available else str(slot.root)),
                timeout=timeout,
                max_output_bytes=cap,
                stdin=stdin.encode() if stdin is not None else None,
                on_start=slot.procs.add,
            )
        slot.procs.difference_update({p for p in slot.procs if p.returncode is not None})
        return outcome.to_json()

    async def reset(self, slot: SlotState) -> dict:
        self._kill_slot(slot)
        async with slot.lock:
            await asyncio.to_thread(shutil.rmtree, slot.root, True)
            slot.root.mkdir(parents=True, exist_ok=True)
            slot.generation += 1
        return {"slot": slot.id, "generation": slot.generation}

    async def read_file(self, slot: SlotState, path: str) -> bytes:
        target = self.resolve(slot, path, must_exist=True)
        if target.is_dir():
            raise RequestError(400, "is_directory", f"{path!r} is a directory; list it with /artifacts")
        size = target.stat().st_size
        if size > self.config.max_file_bytes:
            raise RequestError(413, "too_large", f"{path!r} is {size} bytes; the limit is {self.config.max_file_bytes}")
        return await asyncio.to_thread(target.read_bytes)

    async def write_file(self, slot: SlotState, path: str, data: bytes) -> dict:
        if len(data) > self.config.max_file_bytes:
            raise RequestError(413, "too_large", f"{len(data)} bytes is over the limit of {self.config.max_file_bytes}")
        target = self.resolve(slot, path)
        if target == slot.root.resolve() or target.is_dir():
            raise RequestError(400, "is_directory", f"{path!r} is a directory; give a file path")

        def _write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            # Re-check after creating parents: a symlinked parent must not redirect the write.
            if not target.parent.resolve().is_relative_to(slot.root.resolve()):
                raise RequestError(403, "path_escape", f"path {path!r} leads outside the workspace")
            target.write_bytes(data)

        await asyncio.to_thread(_write)
        return {"path": path, "bytes_written": len(data)}

    def list_artifacts(self, slot: SlotState, path: str) -> dict:
        base = self.resolve(slot, path, must_exist=True)
        root = slot.root.resolve()
        entries = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != ".git"]
            for name in filenames:
                full = Path(dirpath) / name
                if full.is_symlink():
                    continue
                entries.append({"path": str(full.relative_to(root)), "size": full.stat().st_size})
            if len(entries) > 10_000:
                break
        entries.sort(key=lambda e: e["path"])
        return {"files": entries[:10_000], "truncated": len(entries) > 10_000}

    def archive(self, slot: SlotState, path: str) -> bytes:
        base = self.resolve(slot, path, must_exist=True)
        root = slot.root.resolve()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            # Symlinks are stored as links, never followed: an archive cannot carry host files.
            tar.add(base, arcname=str(base.relative_to(root)) or ".", recursive=True)
        if buf.tell() > self.config.max_file_bytes:
            raise RequestError(413, "too_large", f"archive of {path!r} is over {self.config.max_file_bytes} bytes")
        return buf.getvalue()

    async def batch_call(self, call: dict) -> dict:
        slot = self._slot(str(call.get("slot")))
        op = call.get("op")
        if op == "exec":
            return await self.exec(slot, call)
        if op == "read_file":
            data = await self.read_file(slot, call.get("path"))
            return {"data_b64": base64.b64encode(data).decode()}
        if op == "write_file":
            try:
                data = base64.b64decode(call.get("data_b64", ""), validate=True)
            except (ValueError, TypeError):
                raise RequestError(400, "bad_request", "'data_b64' must be base64") from None
            return await self.write_file(slot, call.get("path"), data)
        raise RequestError(400, "bad_request", f"unknown op {op!r}; use exec, read_file or write_file")

    def health(self) -> dict:
        return {
            "status": "ok",
            "api_version": API_VERSION,
            "pid": os.getpid(),
            "isolation": {
                "available": self.isolation.available,
                "bwrap": self.isolation.bwrap,
                "reason": self.isolation.reason,
            },
            "slots": [{"id": s.id, "busy": s.lock.locked(), "generation": s.generation} for s in self.slots.values()],
            "workspace": self.config.workspace_mount if self.isolation.available else None,
            "cache": self.config.cache_mount if self.isolation.available else None,
            "python": os.path.join(self._python_bin, "python"),
        }

    def authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), self._token)


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": message, "kind": kind}, status=status)


def build_app(server: SandboxServer) -> web.Application:
    @web.middleware
    async def guard(request: web.Request, handler):
        if not server.authorized(request):
            return _error(401, "unauthorized", "missing or wrong bearer token; send 'Authorization: Bearer <token>'")
        try:
            return await handler(request)
        except RequestError as exc:
            return _error(exc.status, exc.kind, str(exc))
        except FileNotFoundError as exc:
            return _error(404, "not_found", str(exc))
        except (IsADirectoryError, NotADirectoryError) as exc:
            return _error(400, "is_directory", str(exc))

    async def json_body(request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError(400, "bad_request", "the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise RequestError(400, "bad_request", "the body must be a JSON object")
        return body

    async def health(request):
        return web.json_response(server.health())

    async def exec_(request):
        slot = server._slot(request.match_info["slot"])
        return web.json_response(await server.exec(slot, await json_body(request)))

    async def reset(request):
        return web.json_response(await server.reset(server._slot(request.match_info["slot"])))

    async def get_file(request):
        slot = server._slot(request.match_info["slot"])
        data = await server.read_file(slot, request.query.get("path", ""))
        return web.Response(body=data, content_type="application/octet-stream")

    async def put_file(request):
        slot = server._slot(request.match_info["slot"])
        data = await request.read()
        return web.json_response(await server.write_file(slot, request.query.get("path", ""), data))

    async def artifacts(request):
        slot = server._slot(request.match_info["slot"])
        listing = await asyncio.to_thread(server.list_artifacts, slot, request.query.get("path", "."))
        return web.json_response(listing)

    async def archive(request):
        slot = server._slot(request.match_info["slot"])
        data = await asyncio.to_thread(server.archive, slot, request.query.get("path", "."))
        return web.Response(body=data, content_type="application/gzip")

    async def batch(request):
        body = await json_body(request)
        calls = body.get("calls")
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise RequestError(400, "bad_request", "'calls' must be a list of objects")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)

        async def one(i: int, call: dict) -> bytes:
            try:
                line = {"index": i, "ok": True, "result": await server.batch_call(call)}
            except RequestError as exc:
                line = {"index": i, "ok": False, "status": exc.status, "kind": exc.kind, "error": str(exc)}
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
                line = {"index": i, "ok": False, "status": 404, "kind": "not_found", "error": str(exc)}
            return (json.dumps(line) + "\n").encode()

        # Lines go out as calls finish, so a slow command does not hold back quick ones.
        for fut in asyncio.as_completed([one(i, c) for i, c in enumerate(calls)]):
            await response.write(await fut)
        await response.write_eof()
        return response

    app = web.Application(middlewares=[guard], client_max_size=server.config.max_file_bytes + 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_post("/slots/{slot}/exec", exec_)
    app.router.add_post("/slots/{slot}/reset", reset)
    app.router.add_get("/slots/{slot}/file", get_file)
    app.router.add_put("/slots/{slot}/file", put_file)
    app.router.add_get("/slots/{slot}/artifacts", artifacts)
    app.router.add_get("/slots/{slot}/archive", archive)
    app.router.add_post("/batch", batch)
    return app
