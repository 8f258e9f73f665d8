"""hermes-confine.so on this kernel, for each Landlock ABI it handles: what a program a preloading shell runs can do.

The library is built as the sandbox server's (build_exec_confine.sh), and also told to act as on an older kernel
(ABI 2, the oldest it confines on; ABI 1: nothing). Signals are never scoped (a test.sh pkills its own servers). A shell preloads it, as test.sh's guarded shell does,
and runs a probe program that tries the shell (ptrace, /proc/PID/mem, a signal) and does what honest tests do.
The end to end attacks through the env are in test_guard_ptrace.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import sandbox_server.isolation as isolation
from sandbox_server.bundle import SYSTEM_PATH

BUILD = Path(isolation.__file__).with_name("build_exec_confine.sh")

# Run by the shell: what it can do to that shell (its parent), and what honest tests need.
PROBE = r"""
import ctypes, json, os, tempfile
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
shell, out = os.getppid(), {}
seized = libc.ptrace(0x4206, shell, None, None) == 0  # PTRACE_SEIZE: does not stop it
if seized:
    libc.ptrace(17, shell, None, None)  # PTRACE_DETACH
out["ptrace shell"] = seized
try:
    os.close(os.open(f"/proc/{shell}/mem", os.O_RDWR))
    out["open shell mem"] = True
except OSError:
    out["open shell mem"] = False
try:
    os.kill(shell, 0)
    out["signal shell"] = True
except OSError:
    out["signal shell"] = False
top = tempfile.mkdtemp()
os.makedirs(top + "/a")
os.makedirs(top + "/b")
open(top + "/a/f", "w").close()
os.rename(top + "/a/f", top + "/b/f")
os.link(top + "/b/f", top + "/a/g")
out["rename and link across directories"] = True
child = os.fork()
if child == 0:
    os.pause()
    os._exit(0)
out["ptrace own child"] = libc.ptrace(0x4206, child, None, None) == 0
os.kill(child, 9)
os.waitpid(child, 0)
print(json.dumps(out))
"""
# The shell runs the probe, then a process it kills itself (the guard's kill of what the tests leave).
SHELL = 'unset LD_PRELOAD; python3 -c "$1"; sleep 60 & p=$!; kill -KILL $p; wait $p; echo "killed $?"'


def landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))  # LANDLOCK_CREATE_RULESET_VERSION


pytestmark = [
    pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler"),
    pytest.mark.skipif(landlock_abi() < 2, reason="needs Landlock ABI 2 on this kernel (plays it and ABI 1)"),
]


def probe(tmp_path: Path, *flags: str) -> tuple[dict[str, bool], str]:
    lib = tmp_path / "hermes-confine.so"
    subprocess.run(["bash", str(BUILD), str(lib), *flags], check=True)
    run = subprocess.run(
        ["bash", "-c", SHELL, "shell", PROBE],
        env={"PATH": SYSTEM_PATH, "LD_PRELOAD": str(lib)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    report, killed = run.stdout.splitlines()
    return json.loads(report), killed


HONEST = {"rename and link across directories": True, "ptrace own child": True}


@pytest.mark.parametrize(
    "flags,expected",
    [
        ((), {"ptrace shell": False, "open shell mem": False, "signal shell": True}),
        (("-DHERMES_CONFINE_ABI(found)=2",), {"ptrace shell": False, "open shell mem": False, "signal shell": True}),
        (("-DHERMES_CONFINE_ABI(found)=1",), {"ptrace shell": True, "open shell mem": True, "signal shell": True}),
    ],
    ids=["this-kernel", "abi-2", "abi-1-unconfined"],
)
def test_a_program_the_preloading_shell_runs_cannot_reach_that_shell_and_honest_work_still_runs(
    tmp_path, flags, expected
):
    report, killed = probe(tmp_path, *flags)
    assert report == {**expected, **HONEST}
    assert killed == "killed 137"  # the shell, outside every domain, still kills what it ran


# Run by a spawner (python3, itself run by the preloading shell): may it ptrace / open the memory of its parent (the
# spawner, or the `sh` a script without #! runs in) and of that one's parent?
UP = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def reach(pid):
    if libc.ptrace(0x4206, pid, None, None) == 0:  # PTRACE_SEIZE
        libc.ptrace(17, pid, None, None)
        return True
    try:
        os.close(os.open(f"/proc/{pid}/mem", os.O_RDWR))
        return True
    except OSError:
        return False
parent = os.getppid()
grand = int(open(f"/proc/{parent}/stat").read().rsplit(")", 1)[1].split()[1])
print(json.dumps({"parent": reach(parent), "grandparent": reach(grand)}))
"""
SPAWNS = {
    # CPython's _posixsubprocess: execv (env None), execve (env given); coreutils env: execvp.
    "subprocess-execv": "subprocess.run([sys.executable, '-c', UP])",
    "subprocess-execve": "subprocess.run([sys.executable, '-c', UP], env=dict(os.environ))",
    "env-execvp": "subprocess.run(['env', sys.executable, '-c', UP])",
    # A script without #!: execvp runs it with /bin/sh (ENOEXEC), whose child the probe is.
    "execvp-script": "subprocess.run(['env', script])",
    # posix_spawn (CPython 3.13's subprocess with a path, Rust's Command) starts the library as a trampoline.
    "posix_spawn": "os.waitpid(os.posix_spawn(sys.executable, [sys.executable, '-c', UP], os.environ), 0)",
    "posix_spawnp": "os.waitpid(os.posix_spawnp('python3', ['python3', '-c', UP], os.environ), 0)",
    # libc's own spawns (its internal execve): the shell system() starts stays in the spawner's domain, but what
    # that shell execs is confined again, away from both.
    "system": "os.system(f'python3 -c {shlex.quote(UP)}; true')",
}
SPAWNER = "import os, shlex, subprocess, sys\nUP, script = sys.argv[1], sys.argv[2]\n"


@pytest.mark.parametrize(
    "how,expected",
    [
        ("subprocess-execv", {"parent": False, "grandparent": False}),
        ("subprocess-execve", {"parent": False, "grandparent": False}),
        ("env-execvp", {"parent": False, "grandparent": False}),
        ("execvp-script", {"parent": False, "grandparent": False}),
        ("posix_spawn", {"parent": False, "grandparent": False}),
        ("posix_spawnp", {"parent": False, "grandparent": False}),
        ("system", {"parent": False, "grandparent": False}),
    ],
)
def test_every_exec_below_the_preloading_shell_nests_a_domain_so_no_program_reaches_an_ancestor(
    tmp_path, how, expected
):
    lib = tmp_path / "hermes-confine.so"
    subprocess.run(["bash", str(BUILD), str(lib)], check=True)
    script = tmp_path / "no-shebang"
    script.write_text(f"python3 -c {shlex.quote(UP)}\n")
    script.chmod(0o755)
    run = subprocess.run(
        ["bash", "-c", 'python3 -c "$1" "$2" "$3"; true', "shell", SPAWNER + SPAWNS[how], UP, str(script)],
        env={"PATH": SYSTEM_PATH, "LD_PRELOAD": str(lib)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout, run.stderr
    assert json.loads(run.stdout) == expected


# posix_spawn with a relative path and a chdir file action (glibc's posix_spawn_file_actions_addchdir_np, as Rust's
# Command with current_dir uses): the path is the child's, after the chdir, never the spawner's.
SPAWN_IN_DIR = r"""
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
extern char **environ;
int main(int argc, char **argv) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, argv[1]);
    char *args[] = {"./prog", 0};
    pid_t pid;
    int st = 0, rc = posix_spawn(&pid, "./prog", &fa, 0, args, environ);
    if (rc == 0) waitpid(pid, &st, 0);
    printf("spawn %d, status %d\n", rc, WEXITSTATUS(st));
    return 0;
}
"""


def test_a_relative_program_spawned_after_a_chdir_file_action_runs_as_without_the_library(tmp_path):
    lib, spawner, work = tmp_path / "hermes-confine.so", tmp_path / "spawner", tmp_path / "work"
    subprocess.run(["bash", str(BUILD), str(lib)], check=True)
    (tmp_path / "spawner.c").write_text(SPAWN_IN_DIR)
    subprocess.run(["cc", "-o", str(spawner), str(tmp_path / "spawner.c")], check=True)
    work.mkdir()
    (work / "prog").write_text("#!/bin/sh\necho ran in $(pwd)\n")
    (work / "prog").chmod(0o755)

    def run(env: dict[str, str]) -> str:
        return subprocess.run([str(spawner), str(work)], env=env, capture_output=True, text=True, check=True).stdout

    plain = run({"PATH": SYSTEM_PATH})
    assert plain == f"ran in {work}\nspawn 0, status 0\n"
    assert run({"PATH": SYSTEM_PATH, "LD_PRELOAD": str(lib)}) == plain


# CPython's subprocess runs the child with vfork: the library's execve runs in the spawner's memory. What it
# recorded there as "confined already" (that child's thread id) must not spare a later child that gets the same
# id (a tested program can cycle its pid namespace's ids back to its own in seconds: pid_max is 32768 here). Root
# sets ns_last_pid in a pid namespace of its own to play that cycle.
REUSE = r"""
import json, subprocess, sys
def spawn():
    return json.loads(subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True).stdout)
first = spawn()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(first["pid"] - 1))
second = spawn()
print(json.dumps({"same id": first["pid"] == second["pid"], "reach parent": first["parent"] or second["parent"]}))
"""
REACH_PARENT = UP.replace('"grandparent": reach(grand)', '"pid": os.getpid()')


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_child_that_gets_the_thread_id_of_an_earlier_vfork_child_is_confined_too(tmp_path):
    lib = tmp_path / "hermes-confine.so"
    subprocess.run(["bash", str(BUILD), str(lib)], check=True)
    run = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", 'python3 -c "$1" "$2"; true', "shell"]
        + [REUSE, REACH_PARENT],
        env={"PATH": SYSTEM_PATH, "LD_PRELOAD": str(lib)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout, run.stderr
    assert json.loads(run.stdout) == {"same id": True, "reach parent": False}
