"""Review r14: ways a process the agent leaves in its task container evades the verifier's guard (container_guard.py,
verify.py's guard_script) and writes the reward after it. Each attack solves nothing (the honest score is 0)."""

from __future__ import annotations

import shlex

import pytest

from tests.support.docker_engine import engine_problem
from tests.terminal_tasks import test_task_container_integrity as integrity
from environments.terminal_tasks.container_run import task_container, task_spec
from environments.terminal_tasks.harbor import load_harbor_task
from tests.terminal_tasks.test_task_container_integrity import run, write_task
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


# The process the guard spares is ptraced and made to execve a reward writer: same pid, same start time, still
# spared. Against docker's init and a `sleep infinity` keep-alive (what the guard spared until r15: pid 1 and its
# oldest child) both scored 1.0: same uid, and ptrace needs no capability for a dumpable process.
HIJACK_SPARED = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
names = "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs"
class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in names.split()]
pid = int(sys.argv[2])
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


@pytest.mark.parametrize(
    "command",
    [
        left_running(f"exec python3 -c {shlex.quote(zombie_leader(WRITE_REWARD))}"),
        # Refused (the test below says why); `|| true` so the rollout goes on to the verifier as an agent's would.
        f"python3 -c {shlex.quote(HIJACK_SPARED)} {shlex.quote(WRITE_REWARD)} 1 || true",
    ],
    ids=["zombie-leader", "hijacked-pid-1"],
)
async def test_a_leftover_evading_the_guard_cannot_win(engines, tmp_path, task_image, command):
    verdict = await run(engines, tmp_path, task_image, command)
    assert not verdict.reward, verdict


@pytest.mark.parametrize("user", ["root", "nobody"])
async def test_pid_1_cannot_be_traced_killed_or_written_while_an_own_process_can(engines, tmp_path, task_image, user):
    """Why the hijack above fails: the container's pid 1 is our init, non-dumpable; the same attack code takes over a
    process of the agent's own (so a refusal is the kernel's, not a broken attack)."""
    task = load_harbor_task(write_task(tmp_path))
    async with task_container(engines, task_spec(task, task_image, network=False), task.id) as executor:
        box = executor.box

        async def sh(command: str) -> str:
            result = await box.exec(command, timeout=300, user=user, workdir="/tmp", login=False)
            return result.output

        assert (await sh("tr '\\0' ' ' < /proc/1/cmdline")).strip() == "/.hermes-init --init"
        refused = await sh(f'python3 -c {shlex.quote(HIJACK_SPARED)} \'open("/tmp/pwned-1", "w")\' 1; echo rc=$?')
        assert "AssertionError: 1" in refused and "rc=1" in refused, refused  # EPERM from PTRACE_SEIZE
        mem = await sh('python3 -c \'open("/proc/1/mem", "r+b")\' 2>&1; echo rc=$?')
        assert "PermissionError" in mem and "rc=1" in mem, mem
        await sh("kill -9 1; kill -STOP 1; true")
        assert "State:\tS" in await sh("grep State /proc/1/status")
        # The control: a sleeper the agent started itself is taken over by the same code.
        hijacked = await sh(
            # the sleeper asleep in its own program (the attack rewinds a system call)
            "sleep 600 & pid=$!; "
            "until [ \"$(cat /proc/$pid/comm)\" = sleep ] && grep -q 'State:.S' /proc/$pid/status; do sleep 0.05; done; "
            f'python3 -c {shlex.quote(HIJACK_SPARED)} \'open("/tmp/pwned-own", "w").write("x")\' $pid; '
            "for _ in $(seq 1200); do [ -e /tmp/pwned-own ] && break; sleep 0.1; done; ls /tmp"
        )
        assert "pwned-own" in hijacked and "pwned-1" not in hijacked, hijacked
