"""The seccomp profile of a sandbox_server container (docker, and docker under Nomad).

Not `seccomp=unconfined`, and not the engine's own default either: Docker 20.10's default profile refuses
pivot_root even to a container with CAP_SYS_ADMIN, and bubblewrap cannot build a slot without it. So the
container gets a profile of its own: every call Docker's default refuses to a container with the
capabilities this one has (SYS_ADMIN, NET_ADMIN, SYS_PTRACE), and more, but for what the sandbox runtime
needs: mount, umount2, pivot_root, unshare, setns, clone/clone3 with namespace flags, sethostname (bwrap's
--hostname), personality of any kind. The calls Docker gates on capabilities the container lacks (SYS_MODULE, SYS_BOOT, SYS_TIME...)
would fail for want of the capability anyway; they are refused here too.

Slot commands run under their own, stricter filter (sandbox_server/syscall_filter.h), which refuses the
runtime's calls above as well.
"""

from __future__ import annotations

import json
import platform

__all__ = ["SECURITY_OPT", "profile", "security_opt"]

# Refused with EPERM to every process of the container, the sandbox server (root) included.
DENIED = (
    # Kernel keyrings: a key outlives the container (the uid's persistent keyring) and pins kernel memory.
    "add_key",
    "keyctl",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "fanotify_init",
    "lookup_dcookie",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "iopl",
    "ioperm",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "stime",
    "clock_settime",
    "clock_adjtime",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "vhangup",
    "setdomainname",
    "mbind",
    "migrate_pages",
    "move_pages",
    "set_mempolicy",
    "get_mempolicy",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "afs_syscall",
    "tuxcall",
    "security",
    "vserver",
    "getpmsg",
    "putpmsg",
    "vm86",
    "vm86old",
)
_ARCHES = {
    "x86_64": ["SCMP_ARCH_X86_64"],  # not x86 or x32: another ABI's calls fail (the default action)
    "aarch64": ["SCMP_ARCH_AARCH64"],
}


def profile(machine: str | None = None) -> dict:
    """The profile as the engine takes it (a docker `--security-opt seccomp=<file>`'s JSON)."""
    arches = _ARCHES.get(machine or platform.machine())
    if arches is None:
        raise ValueError(f"no container seccomp profile for {machine or platform.machine()!r}; x86_64 and aarch64 only")
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": arches,
        "syscalls": [{"names": list(DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
    }


# The engine takes a profile's JSON itself in `SecurityOpt`. No AppArmor option: the engine applies its
# default where the kernel has AppArmor (this machine's has none).
SECURITY_OPT = [f"seccomp={json.dumps(profile(), separators=(',', ':'))}"]


def security_opt(engine_version: dict) -> list[str]:
    """`SECURITY_OPT` for Docker; nothing (the engine's default profile) for Podman, given its `version` answer.

    Podman's compatible API reads a `seccomp=` value as a path on its own machine, not as JSON, and its
    default profile (containers-common's) already allows pivot_root and the namespaces to CAP_SYS_ADMIN.
    It does allow keyrings to the container's root; slot commands are refused them by their own filter.
    """
    names = " ".join(str(c.get("Name", "")) for c in engine_version.get("Components") or [])
    return [] if "Podman" in names else SECURITY_OPT
