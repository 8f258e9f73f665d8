"""The sandbox server's work: N slots, one workspace each, one call at a time per slot.
(Its HTTP routes are in routes.py, its settings in config.py.)

Endpoints (all need `Authorization: Bearer <token>`; JSON unless noted):
  GET  /health                          isolation status, slots, interpreter
  POST /slots/{slot}/exec               {command, timeout, max_output_bytes, stdin?, network?, require_isolation?,
                                         as_root? (only on a server started with --allow-root-commands)}
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
import fcntl
import functools
import hmac
import logging
import os
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from sandbox_server.bundle import current_runtime, image_path, image_python, system_program
from sandbox_server.config import ServerConfig
from sandbox_server.errors import FILE_OP_STATUS, RequestError
from sandbox_server.fileops import FileOpError, Workspace
from sandbox_server.isolation import (
    COMMAND_FILE,
    IsolationStatus,
    Sandboxing,
    probe_bwrap,
    probe_ipc_limits,
    probe_spawn_helper,
)
from sandbox_server.procs import ExecResult, run_command
from sandbox_server.quota import LimitExceeded, SlotGuard
from sandbox_server.slot_state import SlotState, kill_uid, slot_env
from sandbox_server.spawner import SlotShell, SlotShellError
from sandbox_server.tree import remove_tree

__all__ = ["SandboxServer"]

log = logging.getLogger("sandbox_server")

API_VERSION = 2
# Commands longer than this go to bash as a script file instead of argv (MAX_ARG_STRLEN is 128 KiB).
ARGV_COMMAND_BYTES = 64 * 1024
# Through a slot's exec server the request is one socket message: keep it well under its limit
# even when JSON escapes every byte (x6).
SHELL_ARGV_BYTES = 16 * 1024


async def _no_spawn_helper() -> tuple[None, str]:
    return None, "the server was started with --no-spawn-helper"


class SandboxServer:
    def __init__(self, config: ServerConfig, token: str) -> None:
        if not token:
            raise ValueError("the sandbox server needs a non-empty bearer token")
        self.config = config
        self._token = token.encode()
        self.data_dir = Path(config.data_dir).resolve()
        self.isolation = IsolationStatus(False, None, "not probed yet")
        self.slots: dict[str, SlotState] = {}
        self.runtime = current_runtime()
        if self.runtime is None:
            # The local backend: slots see this interpreter read-only and first on PATH.
            python_prefix = sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)})
            self._path_head: str | None = str(Path(sys.executable).parent)
            self._python: str | None = os.path.join(self._path_head, "python")
        else:
            # The self-contained runtime: slots see the image's own toolchain only, on the PATH its
            # ENV sets (go, cargo, conda... of an official image), read once as the server starts.
            python_prefix = []
            self._path_head = image_path(os.environ.get("PATH", ""), self.runtime)
            self._python = image_python(self._path_head)
        # By absolute path: a `bash` planted on the slot's PATH must never receive a command.
        self._bash = system_program("bash") or "/bin/bash"
        self.cache_dir = self.data_dir / "cache" if config.cache_mount else None
        self.sandboxing = Sandboxing(
            bwrap=config.bwrap,
            setpriv="setpriv",
            prlimit="prlimit",
            data_dir=self.data_dir,
            workspace_mount=config.workspace_mount,
            cache_dir=self.cache_dir,
            cache_mount=config.cache_mount or "",
            extra_ro=python_prefix + config.extra_ro_paths,
            limits=config.limits,
            runtime=self.runtime,
        )
        # Slots run as uids nobody else uses: RLIMIT_NPROC and kill(-1) then act on one slot only.
        base = config.limits.uid_base
        self.uid_base = base if base is not None else 1_000_000 + (os.getpid() % 1_000_000) * 256
        self._shell_error: str | None = None  # why slots cannot keep an exec server here, if they cannot
        self._ipc_error: str | None = None  # why the slots' IPC namespaces cannot be limited here, if they cannot
        self._filter_error = "bubblewrap isolation is unavailable"  # why commands run with no syscall filter, if so
        self._pool = ThreadPoolExecutor(max_workers=max(4, 2 * config.slots), thread_name_prefix="fileops")
        self.guard = SlotGuard(config.limits, kill_uid)

    async def start(self) -> None:
        self.isolation = await probe_bwrap(self.config.bwrap)
        if self.isolation.available:
            self.sandboxing.bwrap = self.isolation.bwrap or self.config.bwrap
            self.sandboxing.setpriv = self.isolation.setpriv or "setpriv"
            self.sandboxing.prlimit = self.isolation.prlimit or "prlimit"
            wanted = self.config.limits.ipc_sysctls()
            (helper, self._filter_error), self._ipc_error = await asyncio.gather(
                probe_spawn_helper() if self.config.spawn_helper else _no_spawn_helper(),
                probe_ipc_limits(self.sandboxing.bwrap, wanted),
            )
            self.sandboxing.spawn_helper = helper
            if self._ipc_error is None:
                self.sandboxing.ipc_sysctls = wanted
            else:  # (e.g. a sandbox runtime whose /proc/sys is read-only): said in /health, not silent
                log.warning(
                    "slots' IPC namespaces cannot be limited here (%s): SysV memory is not capped", self._ipc_error
                )
            if self.sandboxing.exec_server is None:
                self._shell_error = "hermes-spawn (the slots' exec server) is not built; scripts/setup.sh builds it"
                log.warning("%s: each command runs in a bwrap namespace of its own", self._shell_error)
            if self.sandboxing.spawn_helper is None:
                log.warning(
                    "commands start through prlimit and setpriv, with no syscall filter: %s", self._filter_error
                )
        (self.data_dir / "slots").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "commands").mkdir(mode=0o700, exist_ok=True)
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        config = self.config
        for i in range(self.config.slots):
            root = self.data_dir / "slots" / str(i)
            uid = self.uid_base + i
            owner = (uid, uid) if self.isolation.available else None
            ws = Workspace(
                str(root), self.config.workspace_mount, owner, self.config.max_file_bytes, config.limits.max_path_depth
            )
            slot = SlotState(str(i), root, uid, ws)
            await asyncio.to_thread(self._fresh_workspace, slot)
            self.slots[str(i)] = slot
            if self.isolation.available and self._shell_error is None:
                self._start_shell(slot)
            self.guard.add(slot.id, str(root), uid)
        if self.isolation.available:  # the guard finds a slot's processes by its uid
            self.guard.start()

    async def stop(self) -> None:
        await self.guard.stop()
        for slot in self.slots.values():
            slot.generation += 1
            self._kill_slot(slot)
        await asyncio.gather(*(self._close_shell(s) for s in self.slots.values()))
        if self.isolation.available:
            await asyncio.gather(*(asyncio.to_thread(kill_uid, s.uid) for s in self.slots.values()))
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- helpers -------------------------------------------------------------------------
    def _slot(self, slot_id: str) -> SlotState:
        slot = self.slots.get(slot_id)
        if slot is None:
            raise RequestError(
                404, "unknown_slot", f"no slot {slot_id!r}; this server has slots 0..{len(self.slots) - 1}"
            )
        return slot

    def _kill_slot(self, slot: SlotState) -> None:
        for proc in list(slot.procs):
            proc.kill()

    def _start_shell(self, slot: SlotState) -> None:
        argv = functools.partial(self.sandboxing.shell_argv, slot.root, slot.uid)
        slot.shell = asyncio.create_task(SlotShell.start(argv))

    async def _shell(self, slot: SlotState) -> SlotShell | None:
        """The slot's exec server, started if need be; None if it cannot start here (then bwrap per command)."""
        task = slot.shell
        if task is None or (task.done() and (task.cancelled() or task.exception() or not task.result().alive)):
            if task is not None and task.done() and not task.cancelled() and task.exception() is None:
                await task.result().close()  # its exec server died: start the slot a new one
            self._start_shell(slot)
        assert slot.shell is not None
        try:
            return await asyncio.shield(slot.shell)
        except SlotShellError as exc:
            # e.g. a kernel refusing its namespaces: stay on the slower path instead of retrying each call
            log.warning("slot %s: %s; running each command in a bwrap namespace of its own from now on", slot.id, exc)
            self._shell_error = str(exc)
            return None

    def _shell_ready(self, slot: SlotState) -> bool:
        """The slot's namespace and exec server are up (its next command starts at once)."""
        task = slot.shell
        if task is None or not task.done():
            return self._shell_error is not None or not self.isolation.available  # nothing to wait for
        return not task.cancelled() and task.exception() is None and task.result().alive

    async def _close_shell(self, slot: SlotState) -> None:
        """End the slot's namespace: every command in it dies."""
        task, slot.shell = slot.shell, None
        if task is None:
            return
        try:
            # Not cancelled while it starts: a command may be waiting for it (it then finds it closed).
            shell = await asyncio.shield(task)
        except SlotShellError:
            return
        await shell.close()

    def _fresh_workspace(self, slot: SlotState) -> None:
        root = slot.root
        try:
            remove_tree(root)  # iterative: a tree of any depth goes
        except Exception:  # noqa: BLE001 - whatever stayed, the slot must start clean: a reset never fails the sandbox
            log.exception("slot %s: could not remove its workspace; moving it aside", slot.id)
            root.rename(root.with_name(f"{root.name}.stale-{uuid.uuid4().hex[:8]}"))
        root.mkdir(mode=0o755)
        if self.isolation.available:
            os.chown(root, slot.uid, slot.uid)

    async def _file_op(self, slot: SlotState, fn, *args):
        """Run a (never blocking) file operation in the server's pool, bounded in time and per slot."""
        try:
            async with asyncio.timeout(self.config.file_op_timeout_s):
                async with slot.file_ops:
                    return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except TimeoutError:
            raise RequestError(
                504, "timeout", f"file operation took over {self.config.file_op_timeout_s}s; try a smaller file"
            ) from None
        except FileOpError as exc:
            raise RequestError(FILE_OP_STATUS.get(exc.kind, 400), exc.kind, str(exc)) from None

    # -- operations ------------------------------------------------------------------------
    async def exec(self, slot: SlotState, body: dict) -> dict:
        command = body.get("command")
        if not isinstance(command, str) or not command:
            raise RequestError(400, "bad_request", "'command' must be a non-empty string")
        stdin = body.get("stdin")
        if stdin is not None and not isinstance(stdin, str):
            raise RequestError(400, "bad_request", "'stdin' must be a string")
        if "\x00" in command:
            raise RequestError(400, "bad_command", "the command contains a NUL byte, which bash cannot take; remove it")
        raw = command.encode("utf-8", errors="surrogateescape")
        if len(raw) > self.config.max_command_bytes or len(stdin or "") > self.config.max_command_bytes:
            raise RequestError(
                413,
                "too_large",
                f"the command or its stdin is over {self.config.max_command_bytes} bytes; write large data with write_file",
            )
        try:
            timeout = float(body.get("timeout", 30))
            cap = int(body.get("max_output_bytes", 100_000))
        except (TypeError, ValueError):
            raise RequestError(400, "bad_request", "'timeout' and 'max_output_bytes' must be numbers") from None
        timeout = max(0.05, min(timeout, self.config.max_timeout_s))
        cap = max(1, min(cap, self.config.max_output_bytes))
        network = bool(body.get("network", False))
        require_isolation = body.get("require_isolation", True) is not False
        as_root = body.get("as_root", False)
        if not isinstance(as_root, bool):
            raise RequestError(400, "bad_request", "'as_root' must be true or false")
        if as_root and not self.config.allow_root_commands:
            raise RequestError(
                403,
                "root_refused",
                "this sandbox runs no command as root (start it with --allow-root-commands, container backends only)",
            )
        if as_root and not self.isolation.available:
            raise RequestError(
                503, "isolation_unavailable", "a root command needs bubblewrap isolation, unavailable here"
            )
        if not self.isolation.available and require_isolation:
            raise RequestError(
                503,
                "isolation_unavailable",
                f"this sandbox cannot isolate commands ({self.isolation.reason}); refusing to run unsandboxed. "
                "Fix bubblewrap on the sandbox host, or send require_isolation=false for trusted commands.",
            )
        generation = slot.generation
        async with slot.lock:
            if slot.generation != generation:
                raise RequestError(409, "slot_reset", "the slot was reset while this command waited; it did not run")
            fast = self.isolation.available and not network and not as_root and self._shell_error is None
            shell = await self._shell(slot) if fast else None
            if shell is not None:
                try:
                    async with self.guard.command(slot.id):  # the slot's totals, watched while it runs
                        outcome = await self._exec_in_shell(slot, shell, raw, command, stdin, timeout, cap)
                    return outcome.to_json()
                except SlotShellError as exc:
                    if slot.generation != generation:
                        raise RequestError(409, "slot_reset", "the slot was reset as this command started") from None
                    raise RequestError(503, "sandbox_error", f"{exc}; reset the slot") from None
                except LimitExceeded as exc:
                    raise RequestError(FILE_OP_STATUS.get(exc.kind, 507), exc.kind, str(exc)) from None
            command_file = None
            if len(raw) > ARGV_COMMAND_BYTES:
                command_file = self.data_dir / "commands" / f"{slot.id}-{uuid.uuid4().hex}.sh"
                command_file.write_bytes(raw)
                command_file.chmod(0o644)  # readable by the slot's uid
            try:
                if self.isolation.available:
                    words = [self._bash, COMMAND_FILE] if command_file else [self._bash, "-c", command]
                    argv = self.sandboxing.argv(
                        slot.root, slot.uid, words, network=network, command_file=command_file, as_root=as_root
                    )
                    env = slot_env(self._path_head, self.config.workspace_mount)
                else:
                    argv = [self._bash, str(command_file)] if command_file else [self._bash, "-c", command]
                    env = slot_env(self._path_head, str(slot.root))
                try:
                    async with self.guard.command(slot.id):  # the slot's totals, watched while it runs
                        outcome = await run_command(
                            argv,
                            cwd=str(slot.root),
                            env=env,
                            timeout=timeout,
                            max_output_bytes=cap,
                            stdin=stdin.encode() if stdin is not None else None,
                            on_start=slot.procs.add,
                        )
                except LimitExceeded as exc:
                    raise RequestError(FILE_OP_STATUS.get(exc.kind, 507), exc.kind, str(exc)) from None
            finally:
                if command_file is not None:
                    command_file.unlink(missing_ok=True)
                slot.procs.difference_update({p for p in slot.procs if p.returncode is not None})
        return outcome.to_json()

    async def _exec_in_shell(
        self, slot: SlotState, shell: SlotShell, raw: bytes, command: str, stdin: str | None, timeout: float, cap: int
    ) -> ExecResult:
        script = None
        if len(raw) > SHELL_ARGV_BYTES:
            # Long: bash reads it from a memory file handed over as fd 3 (the request stays small). bash reads a
            # script as it runs, from its own descriptor: the script first closes fd 3, which every program it
            # starts would inherit (one rewrote what the verifying script does after the tests, a forged
            # verdict, or read its nonce), on the first line (line numbers unchanged); and it is sealed.
            script = os.memfd_create("hermes-command", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            view = memoryview(b"exec 3<&-; " + raw)
            while view:
                view = view[os.write(script, view) :]
            seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
            fcntl.fcntl(script, fcntl.F_ADD_SEALS, seals)
            os.lseek(script, 0, os.SEEK_SET)
        spawn = functools.partial(shell.spawn, script_fd=script)
        words = [self._bash, "/dev/fd/3"] if script is not None else [self._bash, "-c", command]
        try:
            return await run_command(
                self.sandboxing.slot_user_argv(slot.uid) + words,
                cwd=self.config.workspace_mount,
                env=slot_env(self._path_head, self.config.workspace_mount),
                timeout=timeout,
                max_output_bytes=cap,
                stdin=stdin.encode() if stdin is not None else None,
                on_start=slot.procs.add,
                spawn=spawn,
            )
        finally:
            if script is not None:
                os.close(script)
            slot.procs.difference_update({p for p in slot.procs if p.returncode is not None})

    async def interrupt(self, slot: SlotState) -> dict:
        """Stop what runs or waits in the slot because its caller gave up; the workspace stays.

        (A trajectory past its time budget is scored next, often by commands in this slot.)
        """
        slot.generation += 1  # commands queued on the lock see this and do not run
        self._kill_slot(slot)  # the rest of the command's processes die with it (pid namespace)
        async with slot.lock:  # returns once the killed command has let go of the slot
            return {"slot": slot.id, "generation": slot.generation}

    async def reset(self, slot: SlotState) -> dict:
        """Kill what runs or waits in the slot, then give it an empty workspace and a new namespace."""
        slot.generation += 1  # commands still queued on the lock see this and do not run
        running = bool(slot.procs)
        self._kill_slot(slot)
        await self._close_shell(slot)  # the namespace, /tmp and every process in it end here
        if running and self.isolation.available:
            # This also gets anything of the slot's uid that got out some other way.
            await asyncio.to_thread(kill_uid, slot.uid)
        async with slot.lock:
            await self._close_shell(slot)  # one a command started meanwhile still sees the old workspace
            await asyncio.to_thread(self._fresh_workspace, slot)
            self.guard.reset(slot.id)
            if self.isolation.available and self._shell_error is None:
                self._start_shell(slot)  # ready by the next command, mostly
        return {"slot": slot.id, "generation": slot.generation}

    # `path` is whatever the caller sent; Workspace.parts() refuses anything but a non-empty string.
    async def read_file(self, slot: SlotState, path: object) -> bytes:
        return await self._file_op(slot, slot.workspace.read, path)

    async def write_file(self, slot: SlotState, path: object, data: bytes) -> dict:
        room = await self.guard.room(slot.id, len(data))
        written, made = await self._file_op(slot, slot.workspace.write, path, data, room)
        self.guard.wrote(slot.id, written, made)
        return {"path": path, "bytes_written": written}

    async def list_artifacts(self, slot: SlotState, path: str) -> dict:
        return await self._file_op(slot, slot.workspace.list_files, path)

    async def archive(self, slot: SlotState, path: str) -> bytes:
        return await self._file_op(slot, slot.workspace.archive, path)

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
        iso = self.isolation.available
        lim = self.config.limits
        return {
            "status": "ok",
            "api_version": API_VERSION,
            "pid": os.getpid(),
            "isolation": {
                "available": iso,
                "bwrap": self.isolation.bwrap,
                "reason": self.isolation.reason,
            },
            # What is enforced on each slot's commands, and how (nothing when isolation is unavailable).
            "enforced": {
                "namespaces": ["mount", "pid", "ipc", "uts", "cgroup", "net (unless the call asks for network)"]
                if iso
                else [],
                "uid": f"one unprivileged uid per slot ({self.uid_base}+slot), no capabilities, no_new_privs"
                if iso
                else None,
                "max_processes": {"value": lim.max_processes, "how": "RLIMIT_NPROC per slot uid"} if iso else None,
                "max_memory_bytes": {"value": lim.max_memory_bytes, "how": "RLIMIT_AS per process"} if iso else None,
                "max_cpu_s": {"value": lim.max_cpu_s, "how": "RLIMIT_CPU per process"} if iso else None,
                "max_file_bytes": {"value": lim.max_file_bytes, "how": "RLIMIT_FSIZE"} if iso else None,
                "max_open_files": {"value": lim.max_open_files, "how": "RLIMIT_NOFILE"} if iso else None,
                "tmp_bytes": {"value": lim.tmp_bytes, "how": "private tmpfs per command"} if iso else None,
                "ipc": {
                    "value": self.sandboxing.ipc_sysctls or None,
                    "how": "kernel.* limits of the slot's own IPC namespace (shared memory dies with its last user)"
                    if self._ipc_error is None
                    else f"not enforced: {self._ipc_error}",
                }
                if iso
                else None,
                **self.guard.describe(),
                "cache": "read-only" if iso and self.cache_dir is not None else None,
                "command_start": ("hermes-spawn" if self.sandboxing.spawn_helper else "prlimit + setpriv")
                if iso
                else None,
                "syscall_filter": {
                    "enforced": iso and self.sandboxing.spawn_helper is not None,
                    "how": "seccomp denylist (sandbox_server/syscall_filter.h) installed by hermes-spawn on every "
                    "command, the verifier's included"
                    if iso and self.sandboxing.spawn_helper is not None
                    else f"not enforced: {self._filter_error}",
                },
                "file_ops": "openat per component, O_NOFOLLOW, O_NONBLOCK, regular files only",
                "max_command_bytes": self.config.max_command_bytes,
            },
            "slots": [
                {"id": s.id, "busy": s.lock.locked(), "generation": s.generation, "ready": self._shell_ready(s)}
                for s in self.slots.values()
            ],
            "workspace": self.config.workspace_mount if iso else None,
            "cache": self.config.cache_mount if iso else None,
            # The interpreter slot commands get for the python tool; null: the image has none.
            "python": self._python,
        }

    def authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), self._token)
