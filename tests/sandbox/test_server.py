"""sandbox_server as a real process: auth, isolation under real bubblewrap, limits, slots."""

from __future__ import annotations

import asyncio
import io
import subprocess
import tarfile

import aiohttp
import pytest

from backends.process import start_sandbox_process
from slots.client import SandboxAddress, SandboxClient, SandboxError
from tools.executor import WorkspaceEscapeError


async def run(client, slot, command, timeout=10.0, **kw):
    return await client.exec(slot, command, timeout=timeout, max_output_bytes=100_000, **kw)


async def test_requests_without_the_right_token_get_401(server, http):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": server.token}):
        async with http.post(
            f"{server.url}/slots/0/exec", json={"command": "touch /workspace/x"}, headers=headers
        ) as r:
            assert r.status == 401
            assert "bearer token" in (await r.json())["error"]
    async with http.get(f"{server.url}/health", headers={"Authorization": f"Bearer {server.token}"}) as r:
        assert r.status == 200
        health = await r.json()
    assert health["isolation"]["available"] is True
    assert [s["id"] for s in health["slots"]] == ["0", "1", "2"]


async def test_command_runs_in_its_workspace_and_reports_exit_code(client):
    result = await run(client, "0", "pwd; echo hello > note.txt; cat note.txt; exit 3")
    assert result.exit_code == 3
    assert result.output == "/workspace\nhello\n"
    assert await client.read_file("0", "note.txt") == b"hello\n"
    assert await client.read_file("0", "/workspace/note.txt") == b"hello\n"


async def test_command_cannot_write_outside_its_workspace(client, server):
    marker = server.data_dir / "outside.txt"
    result = await run(
        client,
        "0",
        f"for p in /etc/hermes-x /usr/hermes-x /hermes-x {marker}; do touch $p 2>/dev/null && echo WROTE $p; done; "
        "echo private > /tmp/t; cat /tmp/t",
    )
    assert "WROTE" not in result.output
    assert result.output.endswith("private\n")
    assert not marker.exists()
    # /tmp is private to the call: the next command (or another slot) does not see it.
    again = await run(client, "0", "cat /tmp/t 2>&1 || echo gone")
    assert again.output.strip().endswith("gone")


async def test_command_has_no_capabilities_to_undo_read_only_mounts(client):
    result = await run(
        client,
        "0",
        "grep CapEff /proc/self/status; mount -o remount,rw,bind /usr 2>/dev/null && touch /usr/hermes-escape && echo ESCAPED; "
        "mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED; echo end",
    )
    assert "CapEff:\t0000000000000000" in result.output
    assert "ESCAPED" not in result.output and "MOUNTED" not in result.output
    assert result.output.endswith("end\n")


async def test_slot_cannot_see_another_slots_files(client, server):
    await client.write_file("1", "secret.txt", b"slot one only")
    host_path = server.data_dir / "slots" / "1" / "secret.txt"
    assert host_path.read_bytes() == b"slot one only"
    result = await run(client, "0", f"cat {host_path} 2>&1; ls {server.data_dir} 2>&1; ls -A /workspace")
    assert "slot one only" not in result.output
    assert result.output.count("No such file or directory") == 2
    assert result.output.endswith("No such file or directory\n")  # and slot 0's own workspace is empty


async def test_processes_are_in_their_own_pid_namespace(client, server):
    result = await run(client, "0", "ls /proc | grep -c '^[0-9]'; hostname")
    count, hostname = result.output.split()
    assert int(count) < 10  # only the sandbox's own few processes, not the host's
    assert hostname == "sandbox"


async def test_network_is_off_unless_the_call_allows_it(client, server):
    probe = (
        'python -c "import socket,sys; s=socket.socket(); s.settimeout(2); '
        f"sys.exit(s.connect_ex(('127.0.0.1', {server.port})))\" && echo REACHED || echo BLOCKED"
    )
    assert (await run(client, "0", probe)).output.strip() == "BLOCKED"
    assert (await run(client, "0", probe, network=True)).output.strip() == "REACHED"


def _count(pattern: str) -> int:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return len(out.split())


async def test_timeout_kills_the_whole_process_tree(client):
    # setsid leaves the process group; only the pid namespace dying with bwrap takes it down
    result = await run(
        client, "2", "(sleep 333.25 &); setsid sleep 333.5 & sh -c 'sleep 333.625' & sleep 333.75", timeout=1.0
    )
    assert result.timed_out and result.exit_code is None
    await asyncio.sleep(0.3)
    assert _count("sleep 333") == 0


async def test_background_children_do_not_outlive_a_finished_command(client):
    result = await run(client, "2", "(sleep 334.25 &) ; echo started")
    assert result.exit_code == 0 and result.output == "started\n"
    await asyncio.sleep(0.3)
    assert _count("sleep 334") == 0


async def test_output_is_capped(client):
    result = await client.exec(
        "0", "head -c 500000 /dev/zero | tr '\\0' a; echo done", timeout=10, max_output_bytes=1000
    )
    assert result.truncated and result.exit_code == 0
    assert result.output == "a" * 1000


async def test_paths_leaving_the_workspace_are_refused(client):
    await run(client, "0", "ln -s /etc/passwd link; mkdir -p d; ln -s /etc dirlink")
    for path in ("../x", "/etc/passwd", "a/../../x", "link", "dirlink/hostname"):
        with pytest.raises(WorkspaceEscapeError):
            await client.read_file("0", path)
    for path in ("../x", "/tmp/x", "dirlink/evil", "link"):
        with pytest.raises(WorkspaceEscapeError):
            await client.write_file("0", path, b"x")
    with pytest.raises(FileNotFoundError):
        await client.read_file("0", "missing.txt")


async def test_calls_to_one_slot_run_one_at_a_time(client):
    cmd = "echo start-{0} >> log; sleep 0.3; echo end-{0} >> log"
    await asyncio.gather(*(run(client, "1", cmd.format(i)) for i in range(3)))
    lines = (await client.read_file("1", "log")).decode().split()
    assert len(lines) == 6
    for i in range(0, 6, 2):
        assert lines[i].replace("start", "") == lines[i + 1].replace("end", "")


async def test_reset_empties_the_workspace_and_kills_running_commands(client):
    await client.write_file("0", "keep/me.txt", b"x")
    running = asyncio.create_task(run(client, "0", "sleep 335.5", timeout=60))
    await asyncio.sleep(0.5)
    before = (await client.health())["slots"][0]["generation"]
    await client.reset("0")
    result = await asyncio.wait_for(running, 10)
    assert result.exit_code != 0
    assert _count("sleep 335") == 0
    assert (await run(client, "0", "ls -A")).output == ""
    assert (await client.health())["slots"][0]["generation"] == before + 1


async def test_artifacts_list_and_archive(client):
    await run(
        client, "0", "mkdir -p out/sub && echo a > out/a.txt && echo bb > out/sub/b.txt && ln -s /etc/passwd out/l"
    )
    listing = await client.list_artifacts("0", "out")
    assert listing["files"] == [{"path": "out/a.txt", "size": 2}, {"path": "out/sub/b.txt", "size": 3}]
    data = await client.archive("0", "out")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = sorted(tar.getnames())
        assert tar.extractfile("out/sub/b.txt").read() == b"bb\n"
        assert tar.getmember("out/l").issym()  # stored as a link, the host file is not in the archive
    assert names == ["out", "out/a.txt", "out/l", "out/sub", "out/sub/b.txt"]


async def test_batch_runs_calls_across_slots_and_reports_each(client):
    calls = [
        {"slot": "0", "op": "exec", "command": "echo zero", "timeout": 5, "max_output_bytes": 100},
        {"slot": "1", "op": "write_file", "path": "f.txt", "data_b64": "aGk="},
        {"slot": "2", "op": "read_file", "path": "../../etc/passwd"},
        {"slot": "9", "op": "exec", "command": "true"},
    ]
    lines = {line["index"]: line async for line in client.batch(calls, timeout=10)}
    assert lines[0]["ok"] and lines[0]["result"]["output"] == "zero\n"
    assert lines[1]["ok"] and await client.read_file("1", "f.txt") == b"hi"
    assert not lines[2]["ok"] and lines[2]["kind"] == "path_escape"
    assert not lines[3]["ok"] and lines[3]["kind"] == "unknown_slot"


async def test_batch_sends_a_finished_call_while_another_still_runs(client):
    # Slot 0 waits for a file that is written only once slot 1's line has arrived: the batch must
    # not hold finished lines back until every call is done.
    wait = "while [ ! -e go ]; do sleep 0.02; done; echo slow"
    calls = [
        {"slot": "0", "op": "exec", "command": wait, "timeout": 60, "max_output_bytes": 100},
        {"slot": "1", "op": "exec", "command": "echo quick", "timeout": 5, "max_output_bytes": 100},
    ]
    seen = []
    async for line in client.batch(calls, timeout=60):
        seen.append((line["index"], line["result"]["output"]))
        if line["index"] == 1:
            await client.write_file("0", "go", b"")
    assert seen == [(1, "quick\n"), (0, "slow\n")]


async def test_without_bubblewrap_isolated_calls_are_refused_and_health_says_why(tmp_path):
    proc = await start_sandbox_process(data_dir=tmp_path / "s", slots=1, bwrap="/nonexistent/bwrap")
    try:
        async with aiohttp.ClientSession() as http:
            client = SandboxClient(SandboxAddress("nobwrap", proc.url, proc.token), http)
            health = await client.health()
            assert health["isolation"]["available"] is False
            assert "not found" in health["isolation"]["reason"]
            with pytest.raises(SandboxError) as err:
                await run(client, "0", "touch x")
            assert err.value.status == 503 and err.value.kind == "isolation_unavailable"
            assert not (proc.data_dir / "slots" / "0" / "x").exists()
            body = {"command": "echo trusted", "timeout": 5, "max_output_bytes": 100, "require_isolation": False}
            async with http.post(
                f"{proc.url}/slots/0/exec", json=body, headers={"Authorization": f"Bearer {proc.token}"}
            ) as r:
                assert (await r.json())["output"] == "trusted\n"
    finally:
        await proc.stop()


async def test_backgrounded_child_does_not_stall_a_finished_command(client):
    # the same case in a local workspace: tests/test_tools.py (one runner for both)
    result = await run(client, "1", "sleep 20 & echo hi", timeout=8)
    assert (result.output, result.exit_code, result.timed_out) == ("hi\n", 0, False)
    assert result.duration_s < 4
