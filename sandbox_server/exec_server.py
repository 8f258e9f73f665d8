"""A slot's exec server, run inside the slot's long-lived bubblewrap namespace (see spawner.py).

Standard library only, and small on purpose: it forks for every command, and a fork costs in
proportion to the memory it copies. Run as `python -I -S exec_server.py EXEC_FD CTL_FD TMP_BYTES TMP_BINDS`.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import select
import selectors
import signal
import socket
import sys
import time

MNT_DETACH, MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 2, 1, 2, 4, 32, 4096, 16384
KEEP_DIR = "/.hermes-keep"  # isolation.KEEP_DIR (this file imports nothing of the package)
PR_SET_CHILD_SUBREAPER, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 36, 24, 38, 47
_MAX_MESSAGE = 256 * 1024


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _command(req: dict, fds: dict[str, int]) -> None:
    """In the forked command process: the slot's uid and limits, then exec. Never returns.

    The rest was done once for the whole server (`_drop_for_children`): an empty bounding set,
    no inheritable or ambient capabilities, no_new_privs, default SIGPIPE/SIGXFSZ.
    """
    try:
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
        uid = req["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # permitted and effective capabilities go with uid 0
        os.chdir(req["cwd"])
        os.execvpe(req["argv"][0], req["argv"], req["env"])
    except BaseException as exc:  # noqa: BLE001 - whatever went wrong, say it on the command's output
        try:
            os.write(2, f"sandbox: cannot start the command: {exc}\n".encode())
        finally:
            os._exit(127)


def _drop_for_children(libc) -> None:
    """What every command must not have, taken from this server once (children inherit it).

    None of it limits the server itself, which never execs: it keeps its permitted and
    effective capabilities.
    """
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last_cap = int(fh.read())
    for cap in range(last_cap + 1):
        _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop bounding set")
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data), "read capabilities")
    data[0].inheritable = data[1].inheritable = 0
    _check(libc.capset(ctypes.byref(header), data), "clear inheritable capabilities")
    _check(libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0), "clear ambient capabilities")  # PR_CAP_AMBIENT_CLEAR_ALL
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # Python ignores these; an ignored signal stays ignored across exec (`yes | head` would
    # spin, a file-size limit would not kill). The server itself only writes to its socket.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


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


def _waiting_child(exec_sock: socket.socket, id_pipe: int, null: int) -> None:
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
    _command(req, fds)


def serve(exec_fd: int, ctl_fd: int, tmp_bytes: int, tmp_binds: list[str]) -> None:
    """The exec server's loop.

    A forked child always waits on the exec socket for the next command (so a command costs a
    wake-up, not a fork, on its way in); this loop watches it, kills on request, reports the
    exit code on the control socket, then cleans up and forks the next waiting child.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
    _drop_for_children(libc)
    gc.disable()  # a collection in a forked child would touch (copy) every object; nothing here makes cycles
    exec_sock = socket.socket(fileno=exec_fd)
    ctl = socket.socket(fileno=ctl_fd)
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    # As the subreaper we inherit the command's orphans: reap them as they die (zombies count
    # against the slot's process limit), not only when the command ends.
    chld_r, chld_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(chld_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(chld_r, selectors.EVENT_READ, "sigchld")
    child: dict = {}  # the waiting (or running) child: pid, pidfd, id pipe, id once it took a command
    last_done = 0  # ids only grow: a kill for an id up to this one is stale
    pending_kill = 0  # a kill for a command the child has not picked up yet

    def fork_child() -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _waiting_child(exec_sock, w, null)
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
            if key.data == "sigchld":
                while os.read(chld_r, 4096) == 4096:
                    pass
                _reap(child["status"])
                continue
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


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))
