"""Escaping processes, flags, symlinks, secrets: on the local workspace backend (the `unconfined_tools`
opt-out, on this machine only) and the same attacks on a sandbox slot of each backend (`sandbox_at`)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

from tests.security.conftest import all_text, play, running_sandbox, sandbox_container, sandbox_processes
from tests.support.docker_engine import SandboxPlace, container_exec, container_processes, container_spawn
from tools.executor import LocalWorkspace

CANARIES = {
    "OPENAI_API_KEY": "sk-canary-openai-1f3",
    "TAVILY_API_KEY": "tvly-canary-77",
    "NOMAD_TOKEN": "nomad-canary-42",
    "HF_TOKEN": "hf_canary_9a",
}


def _survivors(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def _escapes(marker: str) -> list[list[tuple[str, dict]]]:
    """Two commands that leave `marker` processes behind in every way a shell can, the second one timing out."""
    sleeper = f"bash -c 'sleep 600; :' {marker}"
    patterns = [
        f"setsid {sleeper} &",
        f"({sleeper} &) &",
        f'nohup setsid bash -c "({sleeper} &)" >/dev/null 2>&1 &',
        f"setsid -f {sleeper} >/dev/null 2>&1",
        f"{sleeper} & disown",
    ]
    return [
        [("terminal", {"command": "\n".join(patterns) + "\necho started"})],
        [("terminal", {"command": "\n".join(patterns) + "\nsleep 100", "timeout": 1})],
    ]


async def test_no_descendant_survives_the_command_or_its_timeout(tmp_path):
    marker = f"hermes-escape-{uuid.uuid4().hex}"
    ws = LocalWorkspace(tmp_path / "ws")
    msgs = await play(ws, _escapes(marker))
    assert msgs[0]["result"]["output"].endswith("started\n")
    assert msgs[1]["result"]["exit_code"] is None  # timed out
    assert _survivors(marker) == []


async def test_no_descendant_survives_a_sandbox_command_or_its_timeout(sandbox_at):
    """Each command's leftovers die as it ends (sandbox_server/exec_server.c), not only at the slot's reset:
    looked at while the trajectory still holds the slot, on this machine or in the container (where the
    escapes are first seen running, so the look would find survivors)."""
    # unique on the machine: pgrep sees every process here, the [docker] variant's (same tmp_path name) too
    marker = f"hermes-escape-{uuid.uuid4().hex}"
    async with running_sandbox(sandbox_at, slots=1) as backend:
        async with backend.trajectory("t") as ex:
            (_, [(_, running)]) = _escapes(marker)
            command = asyncio.create_task(ex.exec(running["command"], timeout=20, max_output_bytes=1000))
            deadline = time.monotonic() + 20
            while len(seen := await sandbox_processes(backend, marker)) < 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            command.cancel()  # the executor kills the command it no longer waits for
            msgs = await play(ex, _escapes(marker))
            survivors = await sandbox_processes(backend, marker)
    assert len(seen) >= 5, seen  # the escapes ran, where the look for survivors looks
    assert msgs[0]["result"]["output"] == "started\n", msgs[0]
    assert msgs[1]["result"]["exit_code"] is None  # timed out
    assert survivors == []


async def test_search_path_cannot_become_a_flag_or_follow_a_link_out(tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("CANARY-in-host-dir")
    ws = LocalWorkspace(tmp_path / "ws")
    (ws.root / "keep.txt").write_text("precious CANARY-free text")
    (ws.root / "out").symlink_to(host)
    msgs = await play(
        ws,
        [
            [
                ("search_files", {"pattern": "*", "path": "-delete", "target": "files"}),
                ("search_files", {"pattern": "CANARY", "path": "out"}),
                ("search_files", {"pattern": "*.txt", "path": "out", "target": "files"}),
            ]
        ],
    )
    assert (ws.root / "keep.txt").exists()
    assert "CANARY-in-host-dir" not in all_text(msgs) and "secret.txt" not in all_text(msgs)
    assert all("error" in m["result"] for m in msgs)


async def _outside_dir(place: SandboxPlace, backend) -> str:
    """A directory with a canary file beside the slot's workspace: on this machine, or in the container
    (under /opt, which slots see read-only, so a followed link would reach it)."""
    where = sandbox_container(backend)
    if where is None:
        host = place.tmp_path / "host"
        host.mkdir()
        (host / "secret.txt").write_text("CANARY-in-host-dir")
        return str(host)
    host = f"/opt/hermes-test-{place.test_id}"
    make = f"mkdir -m 755 {host} && echo CANARY-in-host-dir > {host}/secret.txt && chmod 644 {host}/secret.txt"
    code, out = await asyncio.to_thread(container_exec, *where, ["sh", "-c", make])
    assert code == 0, out
    return host


async def test_sandbox_search_path_cannot_become_a_flag_or_follow_a_link_out(sandbox_at):
    async with running_sandbox(sandbox_at, slots=1) as backend:
        host = await _outside_dir(sandbox_at, backend)
        async with backend.trajectory("t") as ex:
            msgs = await play(
                ex,
                [
                    [("write_file", {"path": "keep.txt", "content": "precious CANARY-free text"})],
                    [
                        (
                            "terminal",
                            {"command": f"ln -s {host} out && echo linked; test -r out/secret.txt && echo readable"},
                        )
                    ],
                    [
                        ("search_files", {"pattern": "*", "path": "-delete", "target": "files"}),
                        ("search_files", {"pattern": "CANARY", "path": "out"}),
                        ("search_files", {"pattern": "*.txt", "path": "out", "target": "files"}),
                    ],
                    [("terminal", {"command": "cat keep.txt"})],
                ],
            )
    # In the container the link leads somewhere the slot can read: only the tool's own check stops the search.
    assert msgs[1]["result"]["output"] == ("linked\nreadable\n" if sandbox_at.kind == "docker" else "linked\n")
    searches = msgs[2:5]
    assert msgs[5]["result"]["output"] == "precious CANARY-free text"
    assert "CANARY-in-host-dir" not in all_text(msgs) and "secret.txt" not in all_text(msgs)
    assert all("error" in m["result"] for m in searches), searches


async def test_tools_get_no_secrets_from_our_environment(tmp_path, monkeypatch):
    for key, value in CANARIES.items():
        monkeypatch.setenv(key, value)
    # a process started with the keys in its environment, as an exported shell variable would be
    holder = subprocess.Popen(["sleep", "60"], env={**CANARIES, "PATH": "/usr/bin:/bin"})
    try:
        ws = LocalWorkspace(tmp_path / "ws")
        msgs = await play(
            ws,
            [
                [
                    ("python", {"code": "import os; print(dict(os.environ))"}),
                    (
                        "terminal",
                        {
                            "command": f"env; cat /proc/[0-9]*/environ /proc/{holder.pid}/environ 2>/dev/null | tr '\\0' '\\n'"
                        },
                    ),
                ]
            ],
        )
    finally:
        holder.kill()
        holder.wait()
    text = all_text(msgs)
    assert "PATH" in text
    assert not [k for k, v in CANARIES.items() if v in text]


async def _container_holder(backend) -> None:
    """On docker: a process in the container with the keys in its environment (none on the local backend)."""
    where = sandbox_container(backend)
    if where is None:
        return
    await asyncio.to_thread(container_spawn, *where, ["sleep", "61.5"], CANARIES)
    deadline = time.monotonic() + 30
    while not (held := [p for p in await asyncio.to_thread(container_processes, *where) if p.args == "sleep 61.5"]):
        assert time.monotonic() < deadline, "the holder never started in the container"
        await asyncio.sleep(0.1)
    code, env = await asyncio.to_thread(container_exec, *where, ["cat", f"/proc/{held[0].pid}/environ"])
    assert code == 0 and CANARIES["HF_TOKEN"] in env, env  # the secret is there in the container


async def test_sandbox_tools_get_no_secrets_either(sandbox_at, monkeypatch):
    """Keys in this process's environment, in a process of this machine, and (docker) in a process of the
    container the slot runs in: no tool output shows one."""
    for key, value in CANARIES.items():
        monkeypatch.setenv(key, value)
    holder = subprocess.Popen(["sleep", "60"], env={**CANARIES, "PATH": "/usr/bin:/bin"})
    try:
        async with running_sandbox(sandbox_at, slots=1) as backend:
            await _container_holder(backend)
            async with backend.trajectory("t") as ex:
                msgs = await play(
                    ex,
                    [
                        [
                            ("python", {"code": "import os; print(dict(os.environ))"}),
                            ("terminal", {"command": "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"}),
                        ]
                    ],
                )
    finally:
        holder.kill()
        holder.wait()
    text = all_text(msgs)
    assert "PATH" in text
    assert not [k for k, v in CANARIES.items() if v in text]
