"""A robust API: big commands, NUL bytes, one bad call in a /batch, reset with queued commands, PID 1."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
import pytest

from model_tools import handle_function_call
from slots.client import SandboxUnavailable
from tools.context import ToolContext

from backends.docker import DATA_DIR
from tests.security.conftest import play, running_sandbox, sandbox_backend, sandbox_container
from tests.support.docker_engine import container_exec, container_processes


async def test_a_1_5_mib_command_runs(sandbox):
    # Through the tool call itself: the scripted model server refuses a 1.5 MiB conversation (HTTP 413).
    big = "x" * (1536 * 1024)
    async with sandbox.trajectory("t") as ex:
        out = json.loads(await handle_function_call("terminal", {"command": f": '{big}'; echo ran"}, ToolContext(ex)))
    assert out == {"output": "ran\n", "exit_code": 0}


async def test_nul_byte_is_a_tool_error_and_the_batch_goes_on(sandbox):
    async with sandbox.trajectory("bad") as bad, sandbox.trajectory("good") as good:
        innocent = asyncio.create_task(play(good, [[("terminal", {"command": "sleep 0.5; echo innocent"})]]))
        msgs = await play(
            bad,
            [
                [
                    ("terminal", {"command": "echo a\x00b"}),
                    ("terminal", {"command": "echo fine"}),
                    ("write_file", {"path": "a\x00b", "content": "x"}),
                ]
            ],
        )
        good_msgs = await innocent
    assert "NUL" in msgs[0]["result"]["error"]
    assert msgs[1]["result"]["output"] == "fine\n"
    assert "NUL" in msgs[2]["result"]["error"]
    assert good_msgs[0]["result"]["output"] == "innocent\n"


async def test_reset_kills_queued_and_running_commands(sandbox_at):
    backend = sandbox_backend(sandbox_at, slots=1, reset_timeout_s=10)
    await backend.start()
    try:
        async with backend.trajectory("sleeper") as ex:
            await play(ex, [[("terminal", {"command": "sleep 120", "timeout": 200})] * 4], time_budget_s=2)
            assert play.last_result.stop_reason == "time_budget"
            t0 = time.monotonic()
        assert time.monotonic() - t0 < 8  # the release (reset) did not wait for the queued sleeps
        (slot,) = backend.slots()
        assert slot.state.value == "free"
        async with backend.trajectory("next") as ex:
            assert (await ex.exec("echo ok", timeout=5, max_output_bytes=100)).output == "ok\n"
    finally:
        await backend.stop()


def _zombies_under(pid: int) -> int:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,stat="], capture_output=True, text=True).stdout
    rows = [line.split() for line in out.splitlines()]
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for p, pp, _ in rows:
            if int(pp) == parent and int(p) not in tree:
                tree.add(int(p))
                frontier.append(int(p))
    return sum(1 for p, _, st in rows if int(p) in tree and st.startswith("Z"))


async def test_server_as_pid_1_leaves_no_zombies(sandbox_at, tmp_path):
    """The server as PID 1 (no init) reaps the orphans reparented to it. On docker PID 1 is the container's
    entrypoint: the runtime's static launcher execs its loader on the runtime's Python, so the server itself
    (sandbox_server/__main__.py forks; PID 1 stays to reap), and whatever an exec into the container leaves
    behind is reparented to it."""
    if sandbox_at.kind == "local":
        await _pid_1_locally(tmp_path)
        return
    async with running_sandbox(sandbox_at, slots=1) as backend:
        where = sandbox_container(backend)
        assert where is not None
        code, cmdline = await asyncio.to_thread(container_exec, *where, ["cat", "/proc/1/cmdline"])
        assert code == 0 and "sandbox_server" in cmdline.split("\0"), cmdline
        async with backend.trajectory("t") as ex:
            for _ in range(30):
                out = await ex.exec("(sleep 0.01 &); true", timeout=10, max_output_bytes=100)
                assert out.exit_code == 0, out
        # The exec's shell exits at once: its background sleeps (output away, so the exec returns) are orphans.
        orphans = "for t in 0.01 0.02 0.03 0.04 2.5; do sleep $t >/dev/null 2>&1 & echo $!; done"
        code, out = await asyncio.to_thread(container_exec, *where, ["sh", "-c", orphans])
        assert code == 0, out
        pids = {int(p) for p in out.split()}
        reparented = [p for p in await asyncio.to_thread(container_processes, *where) if p.pid in pids and p.ppid == 1]
        assert reparented, f"no orphan of {sorted(pids)} was reparented to PID 1"
        deadline = time.monotonic() + 30
        while True:
            procs = await asyncio.to_thread(container_processes, *where)
            left = [p for p in procs if p.pid in pids or p.stat.startswith("Z")]
            if not left or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert left == [], left  # a zombie stays in the table until its parent (PID 1) reaps it


async def _pid_1_locally(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("tok")
    proc = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            sys.executable,
            "-m",
            "sandbox_server",
            "--port",
            "0",
            "--slots",
            "1",
            "--data-dir",
            str(tmp_path / "d"),
            "--token-file",
            str(token_file),
        ],
        stdout=subprocess.PIPE,
        cwd=os.getcwd(),
    )
    try:
        port = json.loads(proc.stdout.readline())["port"]
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer tok"}) as http:
            for _ in range(30):
                async with http.post(
                    f"http://127.0.0.1:{port}/slots/0/exec", json={"command": "(sleep 0.01 &); true"}
                ) as r:
                    assert r.status == 200
        deadline = time.monotonic() + 30
        while _zombies_under(proc.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert _zombies_under(proc.pid) == 0
    finally:
        proc.kill()  # --kill-child takes the namespace's init, and with it the server
        proc.wait(10)


async def test_a_slot_whose_reset_fails_is_replaced(sandbox_at):
    """A workspace the server can neither empty nor move aside: immutable locally (`chattr +i`); on docker,
    whose overlayfs has no such attribute, a bind mount of the workspace onto itself, made as root in the
    container (it has CAP_SYS_ADMIN), so removing or renaming it fails with EBUSY."""
    backend = sandbox_backend(sandbox_at, slots=1, reset_timeout_s=10)
    await backend.start()
    stuck = None
    try:
        with pytest.raises(SandboxUnavailable):  # its sandbox went away under it: void, run again
            async with backend.trajectory("t") as ex:
                await ex.write_file("f.txt", b"x")
                where = sandbox_container(backend)
                if where is None:
                    (proc,) = backend.provider._procs.values()
                    stuck = proc.data_dir / "slots" / "0"
                    subprocess.run(["chattr", "+i", str(stuck)], check=True)
                else:
                    ws = f"{DATA_DIR}/slots/0"
                    code, out = await asyncio.to_thread(container_exec, *where, ["mount", "--bind", ws, ws])
                    assert code == 0, out
        assert backend.replaced == 1
        async with backend.trajectory("next") as ex:
            assert (await ex.exec("ls -A; echo ok", timeout=5, max_output_bytes=100)).output == "ok\n"
    finally:
        if stuck is not None:
            subprocess.run(["chattr", "-i", str(stuck)])
        await backend.stop()
