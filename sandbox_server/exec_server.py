"""A slot's exec server, run inside the slot's long-lived bubblewrap namespace (see spawner.py).

Standard library only, and small on purpose. Run as
`python -I -S exec_server.py EXEC_FD CTL_FD TMP_BYTES TMP_BINDS IPC_SYSCTLS`.

It never runs a command's setup in Python: each command is one `posix_spawn` (a vfork, so no
copy of this process's memory) of the command line the host sent, which starts with the
host's uid-and-limits prefix (`Sandboxing.slot_user_argv`: prlimit, then setpriv switching to
the slot's uid and dropping every capability and the bounding set, then bash).
"""

from __future__ import annotations

import array
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import time

MNT_DETACH, MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 2, 1, 2, 4, 32, 4096, 16384
KEEP_DIR = "/.hermes-keep"  # isolation.KEEP_DIR (this file imports nothing of the package)
PR_SET_CHILD_SUBREAPER, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 36, 24, 38, 47
# What the uid-and-limits prefix needs after exec: root keeps only these (bounding set) across it.
CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 6, 7, 8
_MAX_MESSAGE = 256 * 1024
_KILLED = 128 + signal.SIGKILL


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _drop_for_children(libc) -> None:
    """What every command must not have, taken from this server once (children inherit it).

    The bounding set keeps only CAP_SETUID/SETGID/SETPCAP: a root process exec'd from here gets
    nothing else, and the prefix (setpriv) uses those three to empty the bounding set and
    switch to the slot's uid before it execs the command, which then has no capabilities at
    all. No inheritable or ambient capabilities; no_new_privs. None of it limits the server
    itself, which never execs: it keeps its permitted and effective capabilities.
    """
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last_cap = int(fh.read())
    for cap in range(last_cap + 1):
        if cap not in (CAP_SETGID, CAP_SETUID, CAP_SETPCAP):
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


def _receive(sock: socket.socket, buf: bytearray) -> tuple[bytes, list[int]]:
    """One request and its descriptors, close-on-exec (socket.recv_fds drops its flags argument).

    Into `buf`, allocated once: a fresh 256 KiB buffer per call is an mmap, mremap and munmap
    (a TLB flush) per command."""
    fds = array.array("i")
    n, ancillary, _, _ = sock.recvmsg_into([buf], socket.CMSG_LEN(8 * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    msg = bytes(buf[:n])
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def _spawn(req: dict, fds: dict[str, int]) -> int:
    """Start the command in a session of its own with the caller's pipes as 0/1/2 (and a script as 3)."""
    actions = [
        (os.POSIX_SPAWN_DUP2, fds.get("stdin", fds["null"]), 0),
        (os.POSIX_SPAWN_DUP2, fds["stdout"], 1),
        (os.POSIX_SPAWN_DUP2, fds["stdout"], 2),
    ]
    if "script" in fds:
        actions.append((os.POSIX_SPAWN_DUP2, fds["script"], 3))
    # Every other descriptor here is close-on-exec (the received ones by MSG_CMSG_CLOEXEC).
    argv = req["argv"]
    return os.posix_spawn(argv[0], argv, req["env"], file_actions=actions, setsid=True, setsigmask=())


def _limit_ipc(sysctls: dict[str, str]) -> None:
    """Set the slot's IPC namespace limits (kernel/<name>; they are per namespace, and root here owns them)."""
    for name, value in sysctls.items():
        with open(f"/proc/sys/kernel/{name}", "w") as fh:
            fh.write(value)


def serve(exec_fd: int, ctl_fd: int, tmp_bytes: int, tmp_binds: list[str], ipc_sysctls: dict[str, str]) -> None:
    """The exec server's loop: one command at a time; kill on request; report its exit code.

    Once a command's main process exits, everything else in the namespace is killed and /tmp
    is made fresh before the next command is read.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
    _limit_ipc(ipc_sysctls)
    _drop_for_children(libc)
    gc.disable()  # nothing here makes cycles; no pauses between a command and its report
    for fd in (exec_fd, ctl_fd):
        os.set_inheritable(fd, False)  # passed in by bwrap; no command may hold them
    exec_sock = socket.socket(fileno=exec_fd)
    ctl = socket.socket(fileno=ctl_fd)
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    try:
        os.fstat(3)
    except OSError:  # keep fd 3 taken, so no received descriptor is already the script's target
        os.dup2(null, 3, inheritable=False)
    buf = bytearray(_MAX_MESSAGE)
    # As the subreaper we inherit the command's orphans: reap them as they die (zombies count
    # against the slot's process limit), not only when the command ends. The command's own
    # exit is seen the same way (SIGCHLD, then its status from waitpid): no pidfd per command.
    chld_r, chld_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(chld_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    poll = select.epoll()
    poll.register(ctl.fileno(), select.EPOLLIN)
    poll.register(chld_r, select.EPOLLIN)
    poll.register(exec_fd, select.EPOLLIN)
    reading = True  # exec_fd is registered: it is taken out only if a request comes while a command runs
    child: dict = {}  # the running command: id, pid, status
    last_done = 0  # ids only grow: a kill for an id up to this one is stale
    pending_kill = 0  # a kill for a command not read yet
    cwd = os.getcwd()  # only this server changes it (the host sends the workspace, a mount point)

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

    def report(req_id: int, code: int) -> None:
        nonlocal last_done
        last_done = req_id
        ctl.send(b'{"id": %d, "exit": %d}' % (req_id, code))

    def start() -> None:
        nonlocal cwd
        msg, passed = _receive(exec_sock, buf)
        if not msg:
            raise SystemExit(0)  # the host went away
        req = json.loads(msg)
        fds = dict(zip(req["fds"], passed))
        fds["null"] = null
        try:
            if req["id"] == pending_kill:
                report(req["id"], _KILLED)  # killed before it started: it never runs
                return
            try:
                if cwd != req["cwd"]:
                    os.chdir(req["cwd"])
                    cwd = req["cwd"]
                pid = _spawn(req, fds)
            except OSError as exc:
                os.write(fds["stdout"], f"sandbox: cannot start the command: {exc}\n".encode())
                report(req["id"], 126)
                return
        finally:
            for fd in passed:
                os.close(fd)
        child.update(id=req["id"], pid=pid, status={pid: -1})

    def finish() -> None:
        nonlocal reading
        status = child["status"][child["pid"]]
        _kill_all(child["status"])  # the command is over: nothing it started outlives it
        code = os.waitstatus_to_exitcode(status)
        report(child["id"], code if code >= 0 else 128 - code)
        child.clear()
        fresh_tmp(tmp_bytes)
        if not reading:
            poll.register(exec_fd, select.EPOLLIN)
            reading = True

    ctl.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        for fd, _ in poll.poll():
            if fd == chld_r:
                while os.read(chld_r, 4096) == 4096:
                    pass
                _reap(child.get("status", {}))
            elif fd == exec_fd:
                if not child:
                    start()
                elif reading:  # one command at a time: the next one waits in the socket
                    poll.unregister(exec_fd)
                    reading = False
            else:
                msg = ctl.recv(_MAX_MESSAGE)
                if not msg:
                    return  # the host went away; bwrap's --die-with-parent ends the namespace too
                kill = json.loads(msg)["kill"]
                if child and kill == child["id"]:
                    _kill_all(child["status"])
                elif kill > last_done:
                    pending_kill = kill
        # The command's main process has been reaped (by a SIGCHLD's reap or a kill's): it is over.
        if child and child["status"][child["pid"]] != -1:
            finish()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5]))
