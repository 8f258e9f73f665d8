"""Bubblewrap isolation and per-slot limits for one command in one slot.

Each command gets its own mount, pid, ipc, uts, cgroup and (unless the call allows it)
network namespace; bwrap's init is pid 1 there, so every process the command starts dies
when it exits (or when the server dies). The filesystem it sees is the system directories read-only, the
interpreter's prefix read-only, a private size-capped /tmp, the slot's workspace
read-write at a fixed path and, if configured, the shared cache read-only. Nothing else of
the host is visible.

Inside, `setpriv` switches to the slot's own unprivileged uid with no capabilities and
no_new_privs before the command starts. Limits are rlimits set by `prlimit` before bwrap
starts (inherited by every process of the slot); RLIMIT_NPROC counts per uid, so a slot's
process limit covers all its commands together and a fork bomb stays inside its slot.
These work without cgroups (Modal, Nomad containers, cgroup v1 without systemd).
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

__all__ = ["IsolationStatus", "Sandboxing", "SlotLimits", "probe_bwrap"]

# System directories every command may read. Merged-/usr systems have /bin -> usr/bin;
# those links are recreated as links so the same paths resolve inside.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt")
# Where a command too long for argv (MAX_ARG_STRLEN is 128 KiB) is shown to bash as a script.
COMMAND_FILE = "/.hermes-command.sh"  # in the root: bwrap would make a new parent directory 0700
_NAMESPACES = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
# setpriv needs these to switch to the slot's uid; it then drops them all (bounding set too).
_SWITCH_CAPS = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]


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

    def prlimit_args(self) -> list[str]:
        """`prlimit` options setting these limits on bwrap, hence on every process of the command.

        prlimit in argv rather than a preexec_fn: a preexec_fn makes Python fork the whole server
        for each command (tens of ms with a big heap) instead of a cheap vfork.
        """
        names = {resource.RLIMIT_NPROC: "nproc", resource.RLIMIT_AS: "as", resource.RLIMIT_CPU: "cpu",
                 resource.RLIMIT_FSIZE: "fsize", resource.RLIMIT_NOFILE: "nofile", resource.RLIMIT_CORE: "core"}  # fmt: skip
        args = []
        for which, soft, hard in self.rlimits():
            # never above the server's own hard limit: raising it needs CAP_SYS_RESOURCE
            _, cur_hard = resource.getrlimit(which)
            if cur_hard != resource.RLIM_INFINITY:
                soft, hard = min(soft, cur_hard), min(hard, cur_hard)
            args.append(f"--{names[which]}={soft}:{hard}")
        return args


@dataclass(frozen=True)
class IsolationStatus:
    available: bool
    bwrap: str | None
    reason: str | None = None
    setpriv: str | None = None
    prlimit: str | None = None


async def probe_bwrap(bwrap: str) -> IsolationStatus:
    """Run a trivial command the way slots run theirs; report why it failed if it did."""
    path = shutil.which(bwrap)
    if path is None:
        return IsolationStatus(
            False, None, f"bubblewrap executable {bwrap!r} not found; install the 'bubblewrap' package"
        )
    setpriv, prlimit = shutil.which("setpriv"), shutil.which("prlimit")
    if setpriv is None or prlimit is None:
        return IsolationStatus(
            False, path, "setpriv or prlimit not found; install util-linux (they set each slot's uid and limits)"
        )
    argv = [prlimit, "--nproc=64:64", path, *_NAMESPACES, "--unshare-net", *_SWITCH_CAPS, "--die-with-parent",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "true"]  # fmt: skip
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
    ) -> None:
        self.bwrap = bwrap
        self.setpriv = setpriv
        self.prlimit = prlimit
        self.data_dir = data_dir
        self.workspace_mount = workspace_mount
        self.cache_dir = cache_dir
        self.cache_mount = cache_mount
        self.limits = limits
        ro = list(SYSTEM_DIRS) + extra_ro
        self._ro: list[str] = []
        for p in ro:
            if p not in self._ro:
                self._ro.append(p)
        self._fixed = self._fixed_binds()
        self._limits = limits.prlimit_args()

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
        # If the server's own data lives under a visible directory (e.g. /opt in the image),
        # cover it so one slot cannot read another's workspace or the server's files.
        data = str(self.data_dir)
        if any(data == c or data.startswith(c.rstrip("/") + "/") for c in covered):
            args += ["--tmpfs", data]
        return args

    def argv(
        self, workspace: Path, uid: int, command: list[str], *, network: bool, command_file: Path | None = None
    ) -> list[str]:
        # Not --as-pid-1: bwrap's own init stays pid 1 (as root, so --die-with-parent holds after
        # setpriv changes uid) and ends the namespace, background children included, when the
        # command exits.
        # No bwrap --new-session: the runner already starts bwrap in a session of its own, so the
        # command has no controlling terminal to inject keystrokes into.
        args = [self.prlimit, *self._limits, self.bwrap, *_NAMESPACES, *_SWITCH_CAPS, "--die-with-parent",
                "--hostname", "sandbox"]  # fmt: skip
        if not network:
            args.append("--unshare-net")
        args += self._fixed
        args += ["--bind", str(workspace), self.workspace_mount]
        if self.cache_dir is not None:
            # Read-only: one trajectory's writes (a git hook in a bare repo) must not reach another's.
            args += ["--ro-bind", str(self.cache_dir), self.cache_mount]
        if command_file is not None:
            args += ["--ro-bind", str(command_file), COMMAND_FILE]
        # bwrap builds the root as a tmpfs; make it read-only so the workspace and /tmp are
        # the only writable places.
        args += ["--remount-ro", "/", "--chdir", self.workspace_mount, "--"]
        args += [self.setpriv, "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "--inh-caps=-all",
                 "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip
        return args + command
