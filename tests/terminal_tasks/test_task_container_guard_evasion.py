"""Review r14: ways a process the agent leaves in its task container evades the verifier's guard (container_guard.py,
verify.py's guard_script) and writes the reward after it. Each attack solves nothing (the honest score is 0)."""

from __future__ import annotations

import shlex

import pytest

from tests.support.docker_engine import engine_problem
from tests.terminal_tasks import test_task_container_integrity as integrity
from tests.terminal_tasks.test_task_container_integrity import run
from tests.terminal_tasks.test_task_container_leftovers import left_running

task_image, engines = integrity.task_image, integrity.engines  # its fixtures, here too

pytestmark = [pytest.mark.slow, pytest.mark.skipif(engine_problem() is not None, reason=str(engine_problem()))]

# Puts reward.txt = 1 back whenever it is anything else, by rename (never an empty file to read).
WRITE_REWARD = (
    "import os, time\n"
    "p = '/logs/verifier/reward.txt'\n"
    "while True:\n"
    "    try:\n"
    "        if open(p).read() != '1\\n':\n"
    "            raise OSError\n"
    "    except OSError:\n"
    "        try:\n"
    "            open(p + '.new', 'w').write('1\\n')\n"
    "            os.replace(p + '.new', p)\n"
    "        except OSError:\n"
    "            pass\n"
    "    time.sleep(0.001)\n"
)


# The main thread exits alone (SYS_exit, not exit_group): /proc/PID/status then says `State: Z`, which the stray
# scan skips, while the other thread runs on and writes the reward after the guard's last clean-up.
def zombie_leader(thread_code: str) -> str:
    """Python that runs `thread_code` in a thread and ends its main thread alone."""
    return (
        "import ctypes, threading, time\n"
        f"threading.Thread(target=lambda: exec({thread_code!r})).start()\n"
        "time.sleep(0.2)\n"
        "ctypes.CDLL(None).syscall(60, 0)  # SYS_exit on x86-64: this thread only\n"
    )


# The keep-alive (`sleep infinity`, spared by the guard as pid 1's oldest child) is ptraced (same uid and
# capabilities: allowed) and made to execve a reward writer: same pid, same start time, still spared.
HIJACK_KEEPALIVE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
names = "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs"
class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in names.split()]
kids = open("/proc/1/task/1/children").read().split()
pid = int(min(kids, key=lambda p: int(open(f"/proc/{p}/stat").read().rsplit(") ", 1)[1].split()[19])))
assert libc.ptrace(16, pid, None, None) == 0, ctypes.get_errno()
os.waitpid(pid, 0x40000000)
regs = Regs()
assert libc.ptrace(12, pid, None, ctypes.byref(regs)) == 0
argv = [b"/usr/bin/python3", b"-c", sys.argv[1].encode()]
base = (regs.rsp - 65536) & ~0xF
blob, ptrs = b"", []
for a in argv:
    ptrs.append(base + len(blob))
    blob += a + b"\0"
blob += b"\0" * (-len(blob) % 8)
arr = base + len(blob)
blob += b"".join(p.to_bytes(8, "little") for p in ptrs) + b"\0" * 8
with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
    mem.seek(regs.rip - 2)
    assert mem.read(2) == b"\x0f\x05"
    mem.seek(base)
    mem.write(blob)
regs.rip -= 2
regs.rax, regs.orig_rax = 59, 2**64 - 1
regs.rdi, regs.rsi, regs.rdx = ptrs[0], arr, 0
assert libc.ptrace(13, pid, None, ctypes.byref(regs)) == 0
assert libc.ptrace(17, pid, None, None) == 0
"""


def _open(hole: str):
    return pytest.mark.xfail(strict=True, reason=f"open: {hole}")


@pytest.mark.parametrize(
    "command",
    [
        left_running(f"exec python3 -c {shlex.quote(zombie_leader(WRITE_REWARD))}"),
        pytest.param(
            f"python3 -c {shlex.quote(HIJACK_KEEPALIVE)} {shlex.quote(WRITE_REWARD)}",
            marks=_open("the spared keep-alive (and pid 1) can be ptraced and made to exec the agent's program"),
        ),
    ],
    ids=["zombie-leader", "hijacked-keepalive"],
)
async def test_a_leftover_evading_the_guard_cannot_win(engines, tmp_path, task_image, command):
    verdict = await run(engines, tmp_path, task_image, command)
    assert not verdict.reward, verdict
