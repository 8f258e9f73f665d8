"""Which run owns a remote sandbox, so a run sweeps only its own leftovers and those of runs provably gone.

Remote sandboxes (Nomad jobs, Modal sandboxes) carry the run's labels: a run id (fresh per run
unless configured, so `evaluate` beside `serve` never shares names), and the host, boot and pid
namespace, pid and kernel start time of the owning process. A sweep removes a sandbox when its
run id is this run's (a restart of a crashed run with the same `run_id`) or when its owner is
provably gone: started on this host, boot and pid namespace (where its pid means something) by a
process that no longer runs (no process with that pid and start time). A sandbox of a process
elsewhere is never swept (that run may be alive; Modal's `timeout` or an operator ends it).
backends/docker.py labels its containers the same way.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RUN_LABEL", "PID_LABEL", "PIDNS_LABEL", "STARTED_LABEL", "RunOwner", "owner_gone", "pid_namespace"]

RUN_LABEL = "hermes_rl_run"
HOST_LABEL = "hermes_rl_host"
PIDNS_LABEL = "hermes_rl_pidns"
PID_LABEL = "hermes_rl_pid"
STARTED_LABEL = "hermes_rl_started"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if it does not run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after "(comm)": state is field 3, starttime field 22


def pid_namespace() -> str:
    """This boot and pid namespace: pids compare only between processes sharing both ("" if unknown)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


@dataclass(frozen=True)
class RunOwner:
    run_id: str
    host: str
    pidns: str
    pid: int
    started: str

    @classmethod
    def current(cls, run_id: str | None = None) -> RunOwner:
        """This process as the owner; `run_id` None: a fresh id."""
        pid = os.getpid()
        return cls(run_id or secrets.token_hex(4), socket.gethostname(), pid_namespace(), pid, _start_time(pid) or "")

    def labels(self) -> dict[str, str]:
        return {
            RUN_LABEL: self.run_id,
            HOST_LABEL: self.host,
            PIDNS_LABEL: self.pidns,
            PID_LABEL: str(self.pid),
            STARTED_LABEL: self.started,
        }

    def sweeps(self, labels: dict[str, str]) -> bool:
        """Whether a sandbox with these labels (of this pool) is this run's leftover or a gone run's."""
        return labels.get(RUN_LABEL) == self.run_id or owner_gone(labels, self.host, self.pidns)


def owner_gone(labels: dict[str, str], host: str, pidns: str) -> bool:
    """True only when the labels name a process of this host, boot and pid namespace that no longer runs."""
    if not pidns or labels.get(HOST_LABEL) != host or labels.get(PIDNS_LABEL) != pidns:
        return False  # another machine, boot or container: nothing here can tell whether it lives
    if not labels.get(PID_LABEL, "").isdigit() or not labels.get(STARTED_LABEL):
        return False
    return _start_time(int(labels[PID_LABEL])) != labels[STARTED_LABEL]
