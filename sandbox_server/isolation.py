"""Bubblewrap isolation and per-slot limits for the commands of one slot.

Each slot has a long-lived namespace (mount, pid, ipc, uts, cgroup and network) made by
bwrap, with the slot's exec server (`hermes-spawn --serve`, exec_server.c) inside; it is recreated when the slot is reset.
Everything a command starts dies when its main process exits, is killed at its timeout, or the
slot is reset (the exec server kills all of the namespace but itself and its init), and each
command gets a private size-capped /tmp. The filesystem it sees is the system directories read-only, the
interpreter's prefix read-only, the slot's workspace read-write at a fixed path and, if
configured, the shared cache read-only. Nothing else of the host is visible.

Each command runs as the slot's own unprivileged uid with no capabilities (bounding set
too) and no_new_privs, set by `slot_user_argv` (hermes-spawn, or prlimit then setpriv) before
bash starts. Limits are rlimits set on each command before it starts (inherited
by every process it makes); RLIMIT_NPROC counts per uid, so a slot's process limit covers
all its commands together and a fork bomb stays inside its slot. These work without cgroups
(Modal, Nomad containers, cgroup v1 without systemd).

A call that asks for network gets the older path: a bwrap namespace of its own (sharing the
host's network), with `setpriv` and `prlimit` doing the same uid switch and limits.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from sandbox_server.identity import slot_identity
from sandbox_server.bundle import Runtime, current_runtime, system_program
from sandbox_server.tree import DEFAULT_MAX_DEPTH

__all__ = ["IsolationStatus", "Sandboxing", "SlotLimits", "probe_bwrap", "probe_ipc_limits"]

# System directories every command may read. Merged-/usr systems have /bin -> usr/bin;
# those links are recreated as links so the same paths resolve inside.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt")
# Where a command too long for argv (MAX_ARG_STRLEN is 128 KiB) is shown to bash as a script.
COMMAND_FILE = "/.hermes-command.sh"  # in the root: bwrap would make a new parent directory 0700
_NAMESPACES = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
# setpriv needs these to switch to the slot's uid; it then drops them all (bounding set too).
_SWITCH_CAPS = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
# A verifier as its container's root (--allow-root-commands): what Docker gives a container's root by
# default, less raw sockets, device nodes and file capabilities; never CAP_SYS_ADMIN, so the
# slot's mounts (read-only root, the other slots hidden) stay as they are.
_ROOT_CAPS = ["--cap-drop", "ALL"] + [
    arg
    for cap in ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP")
    + ("NET_BIND_SERVICE", "SYS_CHROOT")
    for arg in ("--cap-add", f"CAP_{cap}")
]
# The slot's exec server also kills what a command leaves (kill(-1)) and remounts /tmp after it.
_SHELL_CAPS = [*_SWITCH_CAPS, "--cap-add", "CAP_KILL", "--cap-add", "CAP_SYS_ADMIN"]
# The compiled uid-and-limits helper (spawn_helper.c, built by scripts/setup.sh and into the
# self-contained runtime); without it each command goes through prlimit and setpriv instead (two more execs).
_RUNTIME = current_runtime()
SPAWN_HELPER = _RUNTIME.spawn_helper if _RUNTIME is not None else Path(__file__).with_name("hermes-spawn")
SPAWN_HELPER_FILE = "/.hermes-spawn"
# The exec confinement library (exec_confine.c, built by scripts/setup.sh and into the runtime): bound read-only
# in every command's namespace, where a verifier preloads it; read-only, so no tested program (same uid, or the
# container's root without CAP_SYS_ADMIN) can rewrite it. Not bound if not built: the verifier reports that.
CONFINE_LIBRARY = _RUNTIME.confine_library if _RUNTIME is not None else Path(__file__).with_name("hermes-confine.so")
CONFINE_FILE = "/.hermes-confine.so"
KEEP_DIR = "/.hermes-keep"  # a second view of the read-only binds inside /tmp (see exec_server.c)


def _under(parent: str, path: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


class SlotLimits(BaseModel):
    """Per-slot limits; safe defaults for agent commands on a shared machine."""

    max_processes: int = Field(256, ge=8, description="Processes of one slot at once (RLIMIT_NPROC on its uid)")
    max_memory_bytes: int = Field(2 * 1024**3, ge=64 * 1024**2, description="Address space of each process (RLIMIT_AS)")
    max_cpu_s: int = Field(600, ge=1, description="CPU seconds of each process (RLIMIT_CPU)")
    max_file_bytes: int = Field(1024**3, ge=1024**2, description="Largest file a command may write (RLIMIT_FSIZE)")
    max_open_files: int = Field(1024, ge=64, description="Open files per process (RLIMIT_NOFILE)")
    tmp_bytes: int = Field(512 * 1024**2, ge=1024**2, description="Size of each command's private /tmp (tmpfs)")
    workspace_bytes: int = Field(
        4 * 1024**3, ge=1024**2, description="Disk a slot's workspace may use (sandbox_server/quota.py)"
    )
    workspace_files: int = Field(
        250_000,
        ge=100,
        description="Files, directories and links a slot's workspace may hold (its inodes; sandbox_server/quota.py)",
    )
    max_path_depth: int = Field(
        DEFAULT_MAX_DEPTH,
        ge=8,
        le=1024,
        description="Directories a workspace path may nest; file tools refuse deeper paths, deeper trees are removed",
    )
    slot_memory_bytes: int = Field(
        4 * 1024**3,
        ge=64 * 1024**2,
        description="Memory of all a slot's processes together, plus its /tmp (sandbox_server/quota.py)",
    )
    watchdog_interval_s: float = Field(
        0.5, gt=0, le=60, description="How often the slot memory and disk watchdog looks (seconds)"
    )
    uid_base: int | None = Field(
        None, ge=1000, description="First slot's uid (slot i runs as uid_base+i); default derived from the pid"
    )

    def ipc_sysctls(self) -> dict[str, str]:
        """Limits of the slot's own IPC namespace (kernel/<name>), written by its exec server as it starts.

        SysV objects outlive the processes that made them and no process's memory shows them, so
        the watchdog cannot count them: shared memory is destroyed with its last user
        (shm_rmid_forced) and capped at the slot's memory; message queues and semaphores, kernel
        memory, are capped small.
        """
        page = resource.getpagesize()
        return {
            "shm_rmid_forced": "1",
            "shmmax": str(self.slot_memory_bytes),
            "shmall": str(self.slot_memory_bytes // page),
            "shmmni": "256",
            "msgmni": "32",  # x msgmnb (16 KiB by default): at most 512 KiB queued
            "sem": "250 8000 32 32",  # per set, in all, per semop, sets
        }

    def cli_args(self) -> list[str]:
        """These limits as sandbox_server options (how a backend hands them to the servers it starts)."""
        return [w for k, v in self.model_dump(exclude_none=True).items() for w in (f"--{k.replace('_', '-')}", str(v))]

    def rlimits(self) -> list[tuple[int, int, int]]:
        """(resource, soft, hard); the CPU hard limit is a little higher so SIGXCPU (a clear exit 152) comes first."""
        return [
            (resource.RLIMIT_NPROC, self.max_processes, self.max_processes),
            (resource.RLIMIT_AS, self.max_memory_bytes, self.max_memory_bytes),
            (resource.RLIMIT_CPU, self.max_cpu_s, self.max_cpu_s + 5),
            (resource.RLIMIT_FSIZE, self.max_file_bytes, self.max_file_bytes),
            (resource.RLIMIT_NOFILE, self.max_open_files, self.max_open_files),
            (resource.RLIMIT_CORE, 0, 0),
        ]

    def clamped_rlimits(self) -> list[tuple[int, int, int]]:
        """`rlimits()`, never above the server's own hard limits: raising one needs CAP_SYS_RESOURCE."""
        out = []
        for which, soft, hard in self.rlimits():
            _, cur_hard = resource.getrlimit(which)
            if cur_hard != resource.RLIM_INFINITY:
                soft, hard = min(soft, cur_hard), min(hard, cur_hard)
            out.append((which, soft, hard))
        return out

    def prlimit_args(self) -> list[str]:
        """`prlimit` options setting these limits on bwrap, hence on every process of the command.

        prlimit in argv rather than a preexec_fn: a preexec_fn makes Python fork the whole server
        for each command (tens of ms with a big heap) instead of a cheap vfork.
        """
        names = {
            resource.RLIMIT_NPROC: "nproc",
            resource.RLIMIT_AS: "as",
            resource.RLIMIT_CPU: "cpu",
            resource.RLIMIT_FSIZE: "fsize",
            resource.RLIMIT_NOFILE: "nofile",
            resource.RLIMIT_CORE: "core",
        }
        return [f"--{names[which]}={soft}:{hard}" for which, soft, hard in self.clamped_rlimits()]


@dataclass(frozen=True)
class IsolationStatus:
    available: bool
    bwrap: str | None
    reason: str | None = None
    setpriv: str | None = None
    prlimit: str | None = None


def _probe_binds() -> list[str]:
    """The system directories a probe command needs, read-only, as a slot sees them.

    Not `--ro-bind / /`: that drags in every mount of the host (a container engine's overlay
    mounts under /var/lib/docker come and go, and one that cannot be remounted read-only at that
    moment failed the whole probe).
    """
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args + ["--dev", "/dev", "--proc", "/proc"]


async def probe_bwrap(bwrap: str) -> IsolationStatus:
    """Run a trivial command the way slots run theirs; report why it failed if it did."""
    path = shutil.which(bwrap)
    if path is None:
        return IsolationStatus(
            False, None, f"bubblewrap executable {bwrap!r} not found; install the 'bubblewrap' package"
        )
    setpriv, prlimit = system_program("setpriv"), system_program("prlimit")
    if setpriv is None or prlimit is None:
        return IsolationStatus(
            False, path, "setpriv or prlimit not found; install util-linux (they set each slot's uid and limits)"
        )
    argv = [
        prlimit,
        "--nproc=64:64",
        path,
        *_NAMESPACES,
        "--unshare-net",
        *_SWITCH_CAPS,
        "--die-with-parent",
        *_probe_binds(),
        setpriv,
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "true",
    ]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    except (OSError, asyncio.TimeoutError) as exc:
        return IsolationStatus(False, path, f"bubblewrap could not start: {exc}")
    if proc.returncode != 0:
        return IsolationStatus(
            False,
            path,
            "bubblewrap cannot create namespaces or switch uid here "
            f"({err.decode(errors='replace').strip()}); run the sandbox server as root (or privileged in its container)",
        )
    return IsolationStatus(True, path, setpriv=setpriv, prlimit=prlimit)


async def probe_spawn_helper(helper: Path = SPAWN_HELPER) -> tuple[str | None, str]:
    """(`helper`, "") if it is built and, here, switches to an unprivileged uid under the syscall filter
    (syscall_filter.h); else (None, why not): commands then start through prlimit/setpriv, unfiltered."""
    if not os.access(helper, os.X_OK):
        return None, f"hermes-spawn is not built at {helper} (scripts/setup.sh builds it)"
    # The shell reads its own status: "Seccomp: 2" is a filter in force.
    check = 'test "$(id -u)" = 65534 || exit 1; while read -r k v; do [ "$k $v" = "Seccomp: 2" ] && exit 0; done'
    check += " < /proc/self/status; exit 2"
    try:
        proc = await asyncio.create_subprocess_exec(
            str(helper),
            "65534",
            f"{resource.RLIMIT_NPROC}:64:64",
            "--",
            "sh",
            "-c",
            check,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    except (OSError, asyncio.TimeoutError) as exc:
        return None, f"hermes-spawn could not run: {exc}"
    if proc.returncode != 0:
        return None, f"hermes-spawn failed here (exit {proc.returncode}): {err.decode(errors='replace').strip()}"
    return str(helper), ""


async def probe_ipc_limits(bwrap: str, sysctls: dict[str, str]) -> str | None:
    """None if a new IPC namespace here takes `sysctls` from root inside it (as each slot's does); else why not."""
    writes = " && ".join(f"echo {v} > /proc/sys/kernel/{k}" for k, v in sysctls.items())
    argv = [bwrap, *_NAMESPACES, "--unshare-net", *_probe_binds()]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, "/bin/sh", "-c", writes, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    except (OSError, asyncio.TimeoutError) as exc:
        return f"bubblewrap could not start: {exc}"
    if proc.returncode != 0:
        return err.decode(errors="replace").strip() or f"exit {proc.returncode}"
    return None


class Sandboxing:
    """Builds the bwrap command line for a slot."""

    def __init__(
        self,
        *,
        bwrap: str,
        setpriv: str,
        prlimit: str,
        data_dir: Path,
        workspace_mount: str,
        cache_dir: Path | None,
        cache_mount: str,
        extra_ro: list[str],
        limits: SlotLimits,
        runtime: Runtime | None = None,
    ) -> None:
        self.bwrap = bwrap
        self.runtime = runtime
        self.setpriv = setpriv
        self.prlimit = prlimit
        self.data_dir = data_dir
        self.workspace_mount = workspace_mount
        self.cache_dir = cache_dir
        self.cache_mount = cache_mount
        self.limits = limits
        self.spawn_helper: str | None = None  # the host path of hermes-spawn once probed (probe_spawn_helper)
        # The slots' exec server: hermes-spawn's `--serve` mode, whichever prefix commands start behind.
        self.exec_server: str | None = str(SPAWN_HELPER) if os.access(SPAWN_HELPER, os.X_OK) else None
        self.confine_library = str(CONFINE_LIBRARY) if CONFINE_LIBRARY.is_file() else None
        ro = list(SYSTEM_DIRS) + extra_ro
        self._ro: list[str] = []
        for p in ro:
            if p not in self._ro:
                self._ro.append(p)
        self._fixed = self._fixed_binds()
        # Read-only binds that land inside /tmp (an interpreter in a checkout under /tmp): the
        # exec server puts them back each time it gives /tmp a fresh tmpfs.
        self._tmp_binds = [p for p in self._ro_bound if _under("/tmp", p)]
        self._limits = limits.prlimit_args()
        self._helper_limits = [f"{which}:{soft}:{hard}" for which, soft, hard in limits.clamped_rlimits()]
        self._identity: dict[int, list[str]] = {}  # per slot uid: its passwd and group binds (identity.py)
        self.ipc_sysctls: dict[str, str] = {}  # set once probed (probe_ipc_limits): the slots' IPC namespace limits

    def _fixed_binds(self) -> list[str]:
        args = [
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--perms",
            "1777",
            "--size",
            str(self.limits.tmp_bytes),
            "--tmpfs",
            "/tmp",
        ]
        covered: list[str] = []
        binds: list[str] = []
        for p in self._ro:
            if os.path.islink(p):
                args += ["--symlink", os.readlink(p), p]
            elif os.path.exists(p):
                binds += ["--ro-bind", p, p]
                covered.append(p)
        self._ro_bound = covered

        def under_bind(d: str) -> bool:
            return any(d == c or d.startswith(c.rstrip("/") + "/") for c in covered)

        # bwrap makes missing parents of a mount point 0700: the slot's uid could not reach an
        # interpreter bound at /root/.pyenv/... So create them 0755 first.
        parents: list[str] = []
        for p in covered:
            for ancestor in reversed(Path(p).parents):
                d = str(ancestor)
                if d != "/" and d not in parents and not under_bind(d):
                    parents.append(d)
        for d in parents:
            args += ["--perms", "0755", "--dir", d]
        args += binds
        # If the server's own data or runtime lives under a visible directory (e.g. /opt in the
        # image), cover it so one slot cannot read another's workspace or the server's files.
        hidden = [str(self.data_dir)] + ([os.path.realpath(self.runtime.dir)] if self.runtime else [])
        for path in hidden:
            if any(_under(c, path) for c in covered):
                args += ["--tmpfs", path]
        return args

    def _bwrap(self, workspace: Path, uid: int, caps: list[str], *, network: bool) -> list[str]:
        # Not --as-pid-1: bwrap's own init stays pid 1 (as root, so --die-with-parent holds after
        # the uid changes) and ends the namespace, background children included, when its
        # command exits.
        # No bwrap --new-session: the runner already starts bwrap in a session of its own, so the
        # command has no controlling terminal to inject keystrokes into.
        args = [self.bwrap, *_NAMESPACES, *caps, "--die-with-parent", "--hostname", "sandbox"]
        if not network:
            args.append("--unshare-net")
        args += self._fixed
        if "/etc" in self._ro_bound:
            if uid not in self._identity:
                self._identity[uid] = slot_identity(self.data_dir, uid, self.workspace_mount)
            args += self._identity[uid]
        # A workspace mounted at a task's own directory (/home/user): its missing parents 0755, not
        # the 0700 bwrap would make, so the slot's uid can reach it.
        for ancestor in reversed(Path(self.workspace_mount).parents):
            if str(ancestor) != "/" and not any(_under(c, str(ancestor)) for c in self._ro_bound):
                args += ["--perms", "0755", "--dir", str(ancestor)]
        args += ["--bind", str(workspace), self.workspace_mount]
        if self.confine_library is not None:
            args += ["--ro-bind", self.confine_library, CONFINE_FILE]
        if self.cache_dir is not None:
            # Read-only: one trajectory's writes (a git hook in a bare repo) must not reach another's.
            args += ["--ro-bind", str(self.cache_dir), self.cache_mount]
        return args

    def argv(
        self,
        workspace: Path,
        uid: int,
        command: list[str],
        *,
        network: bool,
        command_file: Path | None = None,
        as_root: bool = False,
    ) -> list[str]:
        """One command in a namespace of its own (the path for calls that ask for network or root).

        `as_root`: as uid 0 with `_ROOT_CAPS` (the server checked it may), else as the slot's uid.
        """
        caps = _ROOT_CAPS if as_root else _SWITCH_CAPS
        args = [self.prlimit, *self._limits, *self._bwrap(workspace, uid, caps, network=network)]
        if command_file is not None:
            args += ["--ro-bind", str(command_file), COMMAND_FILE]
        if self.spawn_helper is not None:  # for the syscall filter only: setpriv sets the uid here
            args += ["--ro-bind", self.spawn_helper, SPAWN_HELPER_FILE]
            command = [SPAWN_HELPER_FILE, "--filter", "--", *command]
        # bwrap builds the root as a tmpfs; make it read-only so the workspace and /tmp are
        # the only writable places.
        args += ["--remount-ro", "/", "--chdir", self.workspace_mount, "--"]
        if as_root:
            return args + self._ipc_limits() + [self.setpriv, "--no-new-privs", "--"] + command
        return args + self._ipc_limits() + self._as_slot_user(uid) + command

    def _ipc_limits(self) -> list[str]:
        """The command's own IPC namespace gets the slot's limits from a root shell before setpriv."""
        if not self.ipc_sysctls:
            return []
        writes = "".join(f"echo {v} > /proc/sys/kernel/{k} && " for k, v in self.ipc_sysctls.items())
        return ["/bin/sh", "-c", writes + 'exec "$@"', "sh"]

    def _as_slot_user(self, uid: int) -> list[str]:
        return [
            self.setpriv,
            "--reuid",
            str(uid),
            "--regid",
            str(uid),
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]

    def slot_user_argv(self, uid: int) -> list[str]:
        """The prefix a slot's exec server runs each command behind: the slot's rlimits, then its uid.

        It is exec'd by root (limits only lowered; the bounding set emptied and the uid switched,
        leaving no capabilities), so the exec server never runs a forked copy of itself: a
        posix_spawn of this line is the whole start of a command. hermes-spawn does it in one
        exec; prlimit then setpriv is the same in three.
        """
        if self.spawn_helper is not None:
            return [SPAWN_HELPER_FILE, str(uid), *self._helper_limits, "--"]
        return [self.prlimit, *self._limits, *self._as_slot_user(uid)]

    def shell_argv(self, workspace: Path, uid: int, exec_fd: int, ctl_fd: int) -> list[str]:
        """The slot's long-lived namespace running its exec server (`hermes-spawn --serve`, exec_server.c) as root.

        No rlimits here: each command gets the slot's limits from its own prefix
        (`slot_user_argv`), so the exec server's CPU time and process count never run into them.
        Needs `exec_server` (the built hermes-spawn); the server checks that before it starts a slot.
        """
        assert self.exec_server is not None
        # bwrap's --die-with-parent covers the namespace, not bwrap itself: a server killed while
        # bwrap sets up would leave it waiting for ever. setpriv gives bwrap the same signal.
        args = [self.setpriv, "--pdeathsig", "KILL", "--", *self._bwrap(workspace, uid, _SHELL_CAPS, network=False)]
        args += ["--ro-bind", self.exec_server, SPAWN_HELPER_FILE]
        serve = [SPAWN_HELPER_FILE, "--serve", str(exec_fd), str(ctl_fd), str(self.limits.tmp_bytes)]
        if self._tmp_binds:
            args += ["--perms", "0700", "--dir", KEEP_DIR]  # root's only
            for i, p in enumerate(self._tmp_binds):
                args += ["--ro-bind", p, f"{KEEP_DIR}/{i}"]
                serve += ["--tmp-bind", p]
        serve += [w for k, v in self.ipc_sysctls.items() for w in ("--sysctl", f"{k}={v}")]
        return [*args, "--remount-ro", "/", "--chdir", self.workspace_mount, "--", *serve]
