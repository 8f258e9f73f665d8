"""Slot code meets a syscall filter: no kernel keyrings, bpf, perf, userfaultfd, mounts or new namespaces.

The channel attacked: a key added with add_key/keyctl (ctypes) with open permissions outlives the
command, the slot's reset and the server (and, linked into the uid's persistent keyring, the container),
so a trajectory could leave a verifier's hidden tests for the next one. Played through the agent's
terminal tool and through the verifier's own commands, on each sandbox backend (`sandbox_at`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import uuid
from pathlib import Path

from slots.executor import ExecPolicy
from tests.security.conftest import play, running_sandbox, sandbox_container

# The same syscall through libc's syscall(): returns -1 and errno, or what the kernel returned.
# Numbers per architecture (x86-64, arm64); the probe prints {name: errno, or 0 if the call went through}.
_SYSCALLS = r"""
import ctypes, errno, json, os, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {
    "x86_64": dict(add_key=248, request_key=249, keyctl=250, bpf=321, perf_event_open=298, userfaultfd=323,
                   mount=165, umount2=166, pivot_root=155, unshare=272, setns=308, clone3=435, ptrace=101,
                   personality=135, init_module=175, kexec_load=246, open_by_handle_at=304, syslog=103,
                   io_uring_setup=425, fsopen=430, quotactl=179),
    "aarch64": dict(add_key=217, request_key=218, keyctl=219, bpf=280, perf_event_open=241, userfaultfd=282,
                    mount=40, umount2=39, pivot_root=41, unshare=97, setns=268, clone3=435, ptrace=117,
                    personality=92, init_module=105, kexec_load=104, open_by_handle_at=265, syslog=116,
                    io_uring_setup=425, fsopen=430, quotactl=60),
}[platform.machine()]
L = ctypes.c_long
def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(NR[name]), *[a if isinstance(a, (bytes, ctypes.Array)) else L(a) for a in args])
    return ctypes.get_errno() if r == -1 else 0
"""

# Add a key with every permission for everyone, into the user, session and persistent keyrings.
WRITE_KEY = (
    _SYSCALLS
    + r"""
marker = sys.argv[1].encode()
out = {}
for ring in (-4, -3, -2):  # KEY_SPEC_USER_KEYRING, _USER_SESSION_KEYRING, _PROCESS_KEYRING
    ctypes.set_errno(0)
    kid = libc.syscall(L(NR["add_key"]), b"user", marker, b"hidden-tests", L(12), L(ring))
    out[f"add_key{ring}"] = ctypes.get_errno() if kid == -1 else 0
    if kid > 0:
        out[f"setperm{ring}"] = call("keyctl", 5, kid, 0x3F3F3F3F)  # KEYCTL_SETPERM: all to all
        persistent = libc.syscall(L(NR["keyctl"]), L(22), L(-1), L(-4))  # KEYCTL_GET_PERSISTENT
        if persistent > 0:
            out[f"persist{ring}"] = call("keyctl", 8, kid, persistent)  # KEYCTL_LINK
out["keyctl"] = call("keyctl", 0, -4, 0)  # KEYCTL_GET_KEYRING_ID of the user keyring
print("RESULT " + json.dumps(out))
"""
)

# Look for the key: in /proc/keys (every key this uid may view) and by search of its own keyrings.
READ_KEY = (
    _SYSCALLS
    + r"""
marker = sys.argv[1]
found = []
try:
    found += [l for l in open("/proc/keys") if marker in l]
except OSError:
    pass
for ring in (-4, -3, -2):
    ctypes.set_errno(0)
    kid = libc.syscall(L(NR["keyctl"]), L(10), L(ring), b"user", marker.encode(), L(0))  # KEYCTL_SEARCH
    if kid > 0:
        found.append(f"search{ring}:{kid}")
ctypes.set_errno(0)
kid = libc.syscall(L(NR["request_key"]), b"user", marker.encode(), None, L(0))
if kid > 0:
    found.append(f"request_key:{kid}")
print("RESULT " + json.dumps(found))
"""
)

# Each call with harmless arguments; what each must not do is succeed (or fail any way but EPERM/ENOSYS).
ATTACK = (
    _SYSCALLS
    + r"""
buf = ctypes.create_string_buffer(256)
out = {
    "add_key": call("add_key", b"user", b"probe", b"x", 1, -4),
    "keyctl": call("keyctl", 0, -4, 0),
    "request_key": call("request_key", b"user", b"probe", 0, 0),
    "bpf": call("bpf", 0, buf, 72),  # BPF_MAP_CREATE with an all-zero attribute
    "perf_event_open": call("perf_event_open", buf, 0, -1, -1, 0),
    "userfaultfd": call("userfaultfd", 0),
    "mount": call("mount", b"none", b"/tmp", b"tmpfs", 0, 0),
    "umount2": call("umount2", b"/tmp", 0),
    "pivot_root": call("pivot_root", b"/tmp", b"/tmp"),
    "unshare_user": call("unshare", 0x10000000),  # CLONE_NEWUSER
    "unshare_net": call("unshare", 0x40000000),  # CLONE_NEWNET
    "setns": call("setns", 0, 0),
    "clone3": call("clone3", 0, 0),
    "personality_read_implies_exec": call("personality", 0x0400000),
    "init_module": call("init_module", 0, 0, b""),
    "kexec_load": call("kexec_load", 0, 0, 0, 0),
    "open_by_handle_at": call("open_by_handle_at", -100, buf, 0),
    "syslog": call("syslog", 3, buf, 10),  # SYSLOG_ACTION_READ_ALL
    "io_uring_setup": call("io_uring_setup", 1, buf),
    "fsopen": call("fsopen", b"tmpfs", 0),
    "quotactl": call("quotactl", 0, b"/", 0, 0),
}
# What ordinary code needs still works: a thread, a child process, tracing one's own child.
import subprocess, threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
ok = {"child": subprocess.run(["true"]).returncode == 0, "personality_query": libc.syscall(L(NR["personality"]), L(0xFFFFFFFF)) >= 0}
pid = os.fork()
if pid == 0:
    libc.syscall(L(NR["ptrace"]), L(0), L(0), L(0), L(0))  # PTRACE_TRACEME
    os.kill(os.getpid(), 19)
    os._exit(7)
_, status = os.waitpid(pid, os.WUNTRACED)
ok["ptrace_child"] = os.WIFSTOPPED(status)
libc.syscall(L(NR["ptrace"]), L(7), L(pid), L(0), L(0))  # PTRACE_CONT
_, status = os.waitpid(pid, 0)
ok["ptrace_child_exit"] = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7
# x32 numbers on x86-64 (another ABI behind the same arch value) kill the process.
if platform.machine() == "x86_64":
    pid = os.fork()
    if pid == 0:
        libc.syscall(L(0x40000000 | 39))  # x32 getpid
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    ok["x32_killed"] = os.WIFSIGNALED(status) and os.WTERMSIG(status) == 31  # SIGSYS
print("RESULT " + json.dumps({"denied": out, "ok": ok}))
"""
)

REFUSED = {errno.EPERM, errno.ENOSYS}


def _command(script: str, *args: str) -> str:
    return "python3 - " + " ".join(args) + " <<'EOF'\n" + script + "EOF\n"


def _result(output: str):
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output
    return json.loads(lines[-1][len("RESULT ") :])


async def _tool(executor, script: str, *args: str):
    msgs = await play(executor, [[("terminal", {"command": _command(script, *args)})]])
    return _result(msgs[0]["result"]["output"])


def _host_keys(marker: str) -> list[str]:
    return [line for line in Path("/proc/keys").read_text().splitlines() if marker in line]


def _invalidate(marker: str) -> None:
    """Remove what a failing run left in the kernel (KEYCTL_INVALIDATE; the key gives everyone every right)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for line in _host_keys(marker):
        libc.syscall(250, ctypes.c_long(21), ctypes.c_long(int(line.split()[0], 16)))


async def test_a_key_in_the_kernel_keyring_reaches_no_other_slot_reset_or_server(sandbox_at):
    marker = f"hermes-leak-{uuid.uuid4().hex}"
    try:
        async with running_sandbox(sandbox_at, slots=2) as backend:
            async with backend.trajectory("writer") as w, backend.trajectory("reader") as r:
                wrote = await _tool(w, WRITE_KEY, marker)
                other_slot = await _tool(r, READ_KEY, marker)
            after_reset = await _read_in_both_slots(backend, marker)
        async with running_sandbox(sandbox_at, slots=2) as backend:  # a new server (a new container on docker)
            new_server = await _read_in_both_slots(backend, marker)
        host = _host_keys(marker)
    finally:
        _invalidate(marker)
    assert {k: v for k, v in wrote.items() if v not in REFUSED} == {}, wrote
    assert (other_slot, after_reset, new_server, host) == ([], [[], []], [[], []], [])


async def _read_in_both_slots(backend, marker: str) -> list:
    """READ_KEY in each slot of `backend` at once, each fresh from its reset."""
    async with contextlib.AsyncExitStack() as stack:
        executors = [await stack.enter_async_context(backend.trajectory(f"reader{i}")) for i in range(2)]
        return [await _tool(ex, READ_KEY, marker) for ex in executors]


async def test_slot_and_verifier_commands_cannot_reach_the_kernels_attack_surface(sandbox_at):
    # The verifier's commands: the slot's own path, and the path of a command in a namespace of its own
    # (network for the verifier locally; the image's root on a container backend).
    on_docker = sandbox_at.kind == "docker"
    policy = ExecPolicy(verifier_as_root=True) if on_docker else ExecPolicy(verifier_network=True)
    async with running_sandbox(sandbox_at, slots=1) as backend:
        async with backend.trajectory("attacker", policy) as ex:
            tool = await _tool(ex, ATTACK)
            verifier = _result((await ex.verify_exec(_command(ATTACK), timeout=60, max_output_bytes=100_000)).output)
        async with backend.trajectory("verifier") as ex:
            plain = _result((await ex.verify_exec(_command(ATTACK), timeout=60, max_output_bytes=100_000)).output)
        where = sandbox_container(backend)
        if where is not None:
            inspected = await asyncio.to_thread(_security_opt, *where)
    for seen in (tool, verifier, plain):
        assert {k: v for k, v in seen["denied"].items() if v not in REFUSED} == {}, seen
        assert seen["denied"]["clone3"] == errno.ENOSYS, seen  # so libc falls back to clone, whose flags are checked
        assert all(seen["ok"].values()), seen
    if where is not None:
        assert not any("unconfined" in opt for opt in inspected), inspected


def _security_opt(engine: str, cid: str) -> list[str]:
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        return client.api.inspect_container(cid)["HostConfig"].get("SecurityOpt") or []
    finally:
        client.close()
