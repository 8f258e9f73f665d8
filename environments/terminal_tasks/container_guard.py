"""test.sh in the agent's own task container: what the agent left running runs on into the verifier, as in Harbor.

A server the tests query still answers, so nothing is killed before test.sh: it is paused (SIGSTOP) from before the
engine's diff until test.sh's guard (guard.py, one implementation for slots and task containers) has started. The
guard kills those processes, of any uid, before each of its reward commands and at its exit; afterwards the tests'
files are compared through the engine (docs/security.md). An Endless task's leftovers are killed before the diff.
"""

from __future__ import annotations

import io
import tarfile

from backends.task_container import TaskContainer
from environments.terminal_tasks.guard import GUARD_FAILED, STRAYS, guard_script
from sandbox_server.bundle import SYSTEM_PATH

__all__ = ["FREEZE_LEFTOVERS", "GUARD", "GUARD_FAILED", "STOP_LEFTOVERS", "changed_tests"]

# What the agent left running (any uid) runs on into the verifier, as in Harbor: a server the tests query still
# answers. test.sh runs under verify.py's guard, which stops those processes before each of its reward commands and
# at its exit, sparing pid 1 alone: the container's own init (task_init.c), which the agent cannot ptrace.
_OWN_PID_NS = r"""__hermes_own_pid_ns() { return 0; }
__hermes_any_uid=1
__hermes_spared=1
"""


def _leftovers(step: str) -> str:
    """A root script running the guard's stray scan `step` over every process but pid 1 and this shell's ancestors
    (`timeout`, docker's exec); exit GUARD_FAILED if a fork race outlasts its 50 rounds. Builtins only: the image's
    programs may be the agent's by now."""
    return f"__hermes_sys={SYSTEM_PATH}\n{_OWN_PID_NS}{STRAYS}{step} || exit {GUARD_FAILED}\n"


# Before an Endless task's engine diff: what the agent left running is killed.
STOP_LEFTOVERS = _leftovers("__hermes_stop_strays all")
# Before a Harbor task's engine diff: it is stopped (SIGSTOP), not killed, until the guard has started, so none can
# act in between (write a login profile the verifier's `bash -l` reads, replace the `bash` it runs); the guard's
# first step continues them (a server the tests query).
FREEZE_LEFTOVERS = _leftovers("__hermes_freeze_strays")
GUARD = guard_script(
    reward_dir="/logs/verifier",
    chain=["/", "/logs", "/logs/verifier"],
    pytest_boot="",
    manifest="",
    own_pid_ns=_OWN_PID_NS,
    start="__hermes_thaw_strays",
)


async def changed_tests(box: TaskContainer, files: dict[str, tuple[bytes, int]]) -> list[str]:
    """The tests' files that are no longer the bytes copied in, read through the engine (no program of the
    container runs: the agent's processes may have replaced the image's by now)."""
    try:
        archive = tarfile.open(fileobj=io.BytesIO(await box.read_tar("/tests")))
    except (OSError, tarfile.TarError):
        return ["/tests"]
    found = {}
    for member in archive.getmembers():
        name = member.name.split("/", 1)[1] if "/" in member.name else ""
        if name in files and member.isfile():
            found[name] = archive.extractfile(member).read()  # type: ignore[union-attr]
    return [f"/tests/{name}" for name, (data, _) in sorted(files.items()) if found.get(name) != data]
