"""Which run owns a remote sandbox, so a run sweeps only its own leftovers and those of runs provably gone.

Remote sandboxes (Nomad jobs, Modal sandboxes) carry the run's labels: a run id (fresh per
run unless configured, so `evaluate` beside `serve` never shares names), and the host, pid and
kernel start time of the owning process. A sweep removes a sandbox when its run id is this
run's (a restart of a crashed run with the same `run_id`) or when its owner is provably gone:
it was started on this host and no process with that pid and start time runs here now. A
sandbox of a process on another host is never swept (that run may be alive; Modal's `timeout`
or an operator ends it).
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

__all__ = ["RUN_LABEL", "RunOwner", "owner_gone"]

RUN_LABEL = "hermes_rl_run"
HOST_LABEL = "hermes_rl_host"
PID_LABEL = "hermes_rl_pid"
STARTED_LABEL = "hermes_rl_started"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if it does not run."""
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - one short read of procfs
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after "(comm)": state is field 3, starttime field 22


@dataclass(frozen=True)
class RunOwner:
    run_id: str
    host: str
    pid: int
    started: str

    @classmethod
    def current(cls, run_id: str | None = None) -> RunOwner:
        """This process as the owner; `run_id` None: a fresh id."""
        pid = os.getpid()
        return cls(run_id or secrets.token_hex(4), socket.gethostname(), pid, _start_time(pid) or "")

    def labels(self) -> dict[str, str]:
        return {RUN_LABEL: self.run_id, HOST_LABEL: self.host, PID_LABEL: str(self.pid), STARTED_LABEL: self.started}

    def sweeps(self, labels: dict[str, str]) -> bool:
        """Whether a sandbox with these labels (of this pool) is this run's leftover or a gone run's."""
        return labels.get(RUN_LABEL) == self.run_id or owner_gone(labels, self.host)


def owner_gone(labels: dict[str, str], host: str) -> bool:
    """True only when the labels name a process on `host` (this host) that no longer runs."""
    if labels.get(HOST_LABEL) != host or not labels.get(PID_LABEL, "").isdigit() or not labels.get(STARTED_LABEL):
        return False
    return _start_time(int(labels[PID_LABEL])) != labels[STARTED_LABEL]
