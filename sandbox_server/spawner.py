"""A slot's exec server: one long-lived bubblewrap namespace per slot that starts each command.

Starting bubblewrap costs ~10 ms of namespace and mount setup per command; starting a process
inside an existing namespace costs far less. So each slot keeps one namespace (made by the same
bwrap command line as before, recreated on reset) with its exec server running inside as root
with only CAP_SETUID/SETGID/SETPCAP/KILL/SYS_ADMIN: `hermes-spawn --serve` (exec_server.c, compiled
into the hermes-spawn helper, no interpreter). The slot runs one command at a time; for each:

1. the exec server forks (a small static process: little to copy) and the child, in a session of its
   own with the caller's output and stdin pipes, runs the command line it is sent. That line starts
   with the host's uid-and-limits prefix (`Sandboxing.slot_user_argv`): hermes-spawn's own, which the
   child runs in place (the slot's rlimits, its uid/gid with no capabilities, an empty bounding set,
   no_new_privs, the syscall filter), or prlimit then setpriv (`--no-spawn-helper`), exec'd; then bash;
2. when the command's main process exits (or is killed at its timeout), everything else in the
   slot's pid namespace but its init and the server is killed (kill(-1) with CAP_KILL, until
   nothing is left): setsid and double forks cannot escape, a pid namespace has no way out;
3. then /tmp gets a fresh size-capped tmpfs if the command wrote there, so each command has a
   private /tmp.

This module is the host's end (`SlotShell`): one SOCK_SEQPACKET socket carries the commands
(with the output pipe, stdin pipe and a long command's script passed as file descriptors, so the
host reads output exactly as for a local subprocess), another the kills and exit codes (JSON).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket

__all__ = ["SlotChild", "SlotShell", "SlotShellError"]

# The exec server's replies: an id and an exit code, or its pid once it is ready.
_REPLY_BYTES = 4096


class SlotShellError(Exception):
    """The slot's exec server could not start or refused a command."""


class SlotChild:
    """A command running in a slot's namespace: what `procs.run_command` waits for and kills."""

    def __init__(self, shell: "SlotShell", req_id: str) -> None:
        self._shell = shell
        self.id = req_id
        self.returncode: int | None = None
        self._done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def _finish(self, code: int) -> None:
        if not self._done.done():
            self.returncode = code
            self._done.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._done)

    def kill(self) -> None:
        """SIGKILL the command and everything it started (all of the slot's namespace but its init and server)."""
        if self.returncode is None:
            self._shell._send({"kill": int(self.id)})


class SlotShell:
    """The host's end of one slot's exec server (see the module docstring)."""

    def __init__(self, proc: asyncio.subprocess.Process, exec_sock: socket.socket, sock: socket.socket) -> None:
        self._proc = proc
        self._exec = exec_sock
        self._sock = sock
        self._children: dict[str, SlotChild] = {}
        self._next = 0
        self._buf = bytearray(_REPLY_BYTES)
        self.alive = True
        self._ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(sock.fileno(), self._on_readable)

    @classmethod
    async def start(cls, argv_for_fds, *, timeout: float = 30) -> "SlotShell":
        """Start bwrap with the exec server; `argv_for_fds(exec_fd, ctl_fd)` is its command line."""
        exec_ours, exec_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv_for_fds(exec_theirs.fileno(), theirs.fileno()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=[exec_theirs.fileno(), theirs.fileno()],
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},  # nothing of the server's environment
                start_new_session=True,
            )
        except BaseException as exc:
            ours.close()
            exec_ours.close()
            if isinstance(exc, OSError):
                raise SlotShellError(f"the slot's exec server did not start: {exc}") from None
            raise
        finally:
            theirs.close()
            exec_theirs.close()
        shell = cls(proc, exec_ours, ours)
        try:
            async with asyncio.timeout(timeout):
                await shell._ready
        except BaseException as exc:
            await shell.close()
            assert proc.stderr is not None
            err = (await proc.stderr.read()).decode(errors="replace").strip()
            if isinstance(exc, Exception):
                raise SlotShellError(f"the slot's exec server did not start: {err or exc!r}") from None
            raise
        return shell

    def _on_readable(self) -> None:
        # One message per call, into a buffer made once: another one waiting makes the loop call
        # again, so no second recv (EAGAIN) and no fresh buffer per exit code.
        try:
            size = self._sock.recv_into(self._buf, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            size = 0
        if not size:
            self._gone()
            return
        reply = json.loads(self._buf[:size])
        if "ready" in reply:
            if not self._ready.done():
                self._ready.set_result(reply["ready"])
            return
        child = self._children.pop(str(reply["id"]), None)
        if child is not None:
            # a command the server could not start reads as bash's "cannot execute" (126)
            child._finish(reply.get("exit", 126))

    def _gone(self) -> None:
        """The exec server (hence its namespace and every command in it) is gone."""
        if not self.alive:
            return
        self.alive = False
        asyncio.get_running_loop().remove_reader(self._sock.fileno())
        if not self._ready.done():
            self._ready.set_exception(SlotShellError("the slot's exec server exited while starting"))
        for child in self._children.values():
            child._finish(-signal.SIGKILL)
        self._children.clear()

    def _send(self, msg: dict) -> None:
        if self.alive:
            self._sock.send(json.dumps(msg).encode())

    async def spawn(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        stdout_fd: int,
        stdin_fd: int | None,
        *,
        script_fd: int | None = None,
    ) -> SlotChild:
        """Start argv (which must begin with `Sandboxing.slot_user_argv`: it runs as the server's root)."""
        if not self.alive:
            raise SlotShellError("the slot's exec server is gone")
        self._next += 1
        child = SlotChild(self, str(self._next))
        # exec_server.c's request: "ID\0FDS\0CWD\0ARGC\0ARGV...\0ENV...\0", FDS naming the passed descriptors.
        names, fds = "o", [stdout_fd]
        if stdin_fd is not None:
            names += "i"
            fds.append(stdin_fd)
        if script_fd is not None:
            names += "s"
            fds.append(script_fd)
        words = [str(self._next), names, cwd, str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
        if any("\0" in w for w in words):  # it would shift the request's fields (the server refuses NUL in commands)
            raise SlotShellError("a command, directory or environment entry contains a NUL byte")
        req = "\0".join(words).encode() + b"\0"
        self._children[child.id] = child
        try:
            socket.send_fds(self._exec, [req], fds)
        except OSError as exc:
            self._children.pop(child.id, None)
            raise SlotShellError(f"could not reach the slot's exec server: {exc}") from None
        return child

    async def close(self) -> None:
        """End the namespace: bwrap's init takes every process in it down."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        await self._proc.wait()
        self._gone()
        self._sock.close()
        self._exec.close()
