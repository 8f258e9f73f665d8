"""A slot's exec server: one long-lived bubblewrap namespace per slot that forks each command.

Starting bubblewrap costs ~10 ms of namespace and mount setup per command; a fork inside an
existing namespace costs well under one. So each slot keeps one namespace (made by the same
bwrap command line as before, recreated on reset) with this file running inside as root with
only CAP_SETUID/SETGID/SETPCAP/KILL/SYS_ADMIN. The slot runs one command at a time; for each:

1. it forks the command, which takes its own session, the slot's rlimits, an empty bounding
   set, the slot's uid and gid, no capabilities and no_new_privs, the caller's output and
   stdin pipes, then execs;
2. when the command's main process exits (or is killed at its timeout), everything else in the
   slot's pid namespace but its init and this server is killed (kill(-1) with CAP_KILL, until
   nothing is left): setsid and double forks cannot escape, a pid namespace has no way out;
3. then /tmp is replaced by a fresh size-capped tmpfs, so each command has a private /tmp.

Fewer processes per command than a pid namespace per command (each hand-over between processes
costs a scheduler wake-up, which dominates on a loaded machine).

The host side (`SlotShell`) talks to it over a SOCK_SEQPACKET socket: one JSON message per
request, file descriptors (output pipe, stdin pipe, a long command's script) passed along
with SCM_RIGHTS, so the host reads output exactly as it does for a local subprocess.

The in-namespace part uses the standard library only; it runs as `python -I -S spawner.py FD`.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import resource
import select
import selectors
import signal
import socket
import sys
import time

__all__ = ["SlotChild", "SlotShell"]

MNT_DETACH, MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 2, 1, 2, 4, 32, 4096, 16384
KEEP_DIR = "/.hermes-keep"  # isolation.KEEP_DIR (this file imports nothing of the package)
PR_SET_CHILD_SUBREAPER, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 36, 24, 38, 47
_MAX_MESSAGE = 256 * 1024


# -- inside the slot's namespace ------------------------------------------------------------
class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _command(libc, req: dict, fds: dict[str, int], last_cap: int) -> None:
    """In the forked command process: drop to the slot's uid and limits, then exec. Never returns."""
    try:
        # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec
        # (`yes | head` would spin, a file-size limit would not kill).
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.setsid()
        os.dup2(fds.get("stdin", fds["null"]), 0)
        os.dup2(fds["stdout"], 1)
        os.dup2(fds["stdout"], 2)
        if "script" in fds:
            os.dup2(fds["script"], 3)
            os.closerange(4, 65536)
        else:
            os.closerange(3, 65536)
        for which, soft, hard in req["rlimits"]:
            resource.setrlimit(which, (soft, hard))
        for cap in range(last_cap + 1):
            _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop bounding set")
        uid = req["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # permitted and effective capabilities go with uid 0
        _check(libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)()), "clear capabilities")
        _check(libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0), "clear ambient capabilities")  # PR_CAP_AMBIENT_CLEAR_ALL
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        os.chdir(req["cwd"])
        os.execvpe(req["argv"][0], req["argv"], req["env"])
    except BaseException as exc:  # noqa: BLE001 - whatever went wrong, say it on the command's output
        try:
            os.write(2, f"sandbox: cannot start the command: {exc}\n".encode())
        finally:
            os._exit(127)


def _reap(statuses: dict[int, int]) -> None:
    """Reap every zombie child; keep the statuses of the pids in `statuses`."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in statuses:
            statuses[pid] = status


def _kill_all(statuses: dict[int, int]) -> None:
    """SIGKILL every process in the slot's pid namespace but its init and us, until none is left."""
    for round_ in range(10_000):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        _reap(statuses)  # as the subreaper, the killed orphans' zombies are ours; kill(-1) counts zombies too
        if round_:
            time.sleep(0.0002)


def _waiting_child(libc, exec_sock: socket.socket, id_pipe: int, null: int, last_cap: int) -> None:
    """Forked ahead of time: wait for the next command, tell the server its id, become it. Never returns."""
    try:
        msg, passed, _, _ = socket.recv_fds(exec_sock, _MAX_MESSAGE, 8)
        if not msg:
            os._exit(0)
        req = json.loads(msg)
        os.write(id_pipe, str(req["id"]).encode())
        fds = dict(zip(req["fds"], passed))
        fds["null"] = null
    except BaseException:  # noqa: BLE001 - nothing to report to; the server sees an exit without an id
        os._exit(127)
    _command(libc, req, fds, last_cap)


def serve(exec_fd: int, ctl_fd: int, tmp_bytes: int, tmp_binds: list[str]) -> None:
    """The exec server's loop.

    A forked child always waits on the exec socket for the next command (so a command costs a
    wake-up, not a fork, on its way in); this loop watches it, kills on request, reports the
    exit code on the control socket, then cleans up and forks the next waiting child.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
    exec_sock = socket.socket(fileno=exec_fd)
    ctl = socket.socket(fileno=ctl_fd)
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last_cap = int(fh.read())
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    child: dict = {}  # the waiting (or running) child: pid, pidfd, id pipe, id once it took a command
    last_done = 0  # ids only grow: a kill for an id up to this one is stale
    pending_kill = 0  # a kill for a command the child has not picked up yet

    def fork_child() -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _waiting_child(libc, exec_sock, w, null, last_cap)
        os.close(w)
        gen = child.get("gen", 0) + 1  # events of an earlier child still in a select() batch are stale
        child.clear()
        child.update(pid=pid, pidfd=os.pidfd_open(pid), pipe=r, id=0, status={pid: -1}, gen=gen)
        sel.register(child["pidfd"], selectors.EVENT_READ, ("exit", gen))
        sel.register(r, selectors.EVENT_READ, ("took", gen))

    def took() -> None:
        data = os.read(child["pipe"], 64)
        sel.unregister(child["pipe"])
        os.close(child["pipe"])
        child["pipe"] = None
        child["id"] = int(data or 0)
        if child["id"] and child["id"] == pending_kill:
            _kill_all(child["status"])

    bind_tops = {
        p.split("/")[2] for p in tmp_binds if p.count("/") >= 2
    }  # /tmp/<top>/...: root's directories, read-only below

    def fresh_tmp(size: int) -> None:
        if set(os.listdir("/tmp")) <= bind_tops:
            return  # nothing written there (the usual case): no unmount, which costs every CPU an RCU sync
        _check(libc.umount2(b"/tmp", MNT_DETACH), "unmount /tmp")
        opts = f"size={size},mode=1777".encode()
        _check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount /tmp")
        for i, path in enumerate(tmp_binds):  # bwrap's read-only binds inside /tmp, from their second view
            os.makedirs(path, mode=0o755, exist_ok=True)
            keep = f"{KEEP_DIR}/{i}".encode()
            _check(libc.mount(keep, path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
            _check(libc.mount(None, path.encode(), None, flags, None), f"remount {path} read-only")

    fork_child()
    ctl.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        for key, _ in sel.select():
            if key.data != "ctl" and key.data[1] != child["gen"]:
                continue
            if key.data == "ctl":
                msg = ctl.recv(_MAX_MESSAGE)
                if not msg:
                    return  # the host went away; bwrap's --die-with-parent ends the namespace too
                kill = json.loads(msg)["kill"]
                if child["pipe"] is not None and select_readable(child["pipe"]):
                    took()
                if kill > last_done and kill == child["id"]:
                    _kill_all(child["status"])
                elif kill > last_done:
                    pending_kill = kill
            elif key.data[0] == "took":
                if child["pipe"] is not None:
                    took()
            else:  # the child exited
                if child["pipe"] is not None:
                    took()
                sel.unregister(child["pidfd"])
                os.close(child["pidfd"])
                _reap(child["status"])  # (a kill may have reaped it already)
                status = child["status"][child["pid"]]
                if status == -1:  # not reaped yet (cannot happen once its pidfd is readable; be sure)
                    status = os.waitpid(child["pid"], 0)[1]
                _kill_all(child["status"])  # the command is over: nothing it started outlives it
                if child["id"]:
                    last_done = child["id"]
                    code = os.waitstatus_to_exitcode(status)
                    ctl.send(json.dumps({"id": child["id"], "exit": code if code >= 0 else 128 - code}).encode())
                    fresh_tmp(tmp_bytes)
                fork_child()


def select_readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


# -- on the host -----------------------------------------------------------------------------
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
        except BaseException:
            ours.close()
            exec_ours.close()
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
        while True:
            try:
                msg = self._sock.recv(_MAX_MESSAGE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                msg = b""
            if not msg:
                self._gone()
                return
            reply = json.loads(msg)
            if "ready" in reply:
                if not self._ready.done():
                    self._ready.set_result(reply["ready"])
                continue
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
        uid: int,
        rlimits: list[tuple[int, int, int]],
        script_fd: int | None = None,
    ) -> SlotChild:
        if not self.alive:
            raise SlotShellError("the slot's exec server is gone")
        self._next += 1
        child = SlotChild(self, str(self._next))
        names, fds = ["stdout"], [stdout_fd]
        if stdin_fd is not None:
            names.append("stdin")
            fds.append(stdin_fd)
        if script_fd is not None:
            names.append("script")
            fds.append(script_fd)
        req = {"id": self._next, "argv": argv, "cwd": cwd, "env": env, "uid": uid, "rlimits": rlimits, "fds": names}
        self._children[child.id] = child
        try:
            socket.send_fds(self._exec, [json.dumps(req).encode()], fds)
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


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))
