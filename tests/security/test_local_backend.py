"""The local workspace backend (the default): escaping processes, flags, symlinks, secrets."""

from __future__ import annotations

import subprocess

from tests.security.conftest import all_text, play
from tools.executor import LocalWorkspace

CANARIES = {
    "OPENAI_API_KEY": "sk-canary-openai-1f3",
    "TAVILY_API_KEY": "tvly-canary-77",
    "NOMAD_TOKEN": "nomad-canary-42",
    "HF_TOKEN": "hf_canary_9a",
}


def _survivors(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


async def test_no_descendant_survives_the_command_or_its_timeout(tmp_path):
    marker = f"hermes-escape-{tmp_path.name}"
    sleeper = f"bash -c 'sleep 600; :' {marker}"
    patterns = [
        f"setsid {sleeper} &",
        f"({sleeper} &) &",
        f'nohup setsid bash -c "({sleeper} &)" >/dev/null 2>&1 &',
        f"setsid -f {sleeper} >/dev/null 2>&1",
        f"{sleeper} & disown",
    ]
    ws = LocalWorkspace(tmp_path / "ws")
    turns = [
        [("terminal", {"command": "\n".join(patterns) + "\necho started"})],
        [("terminal", {"command": "\n".join(patterns) + "\nsleep 100", "timeout": 1})],
    ]
    msgs = await play(ws, turns)
    assert msgs[0]["result"]["output"].endswith("started\n")
    assert msgs[1]["result"]["exit_code"] is None  # timed out
    assert _survivors(marker) == []


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


async def test_sandbox_tools_get_no_secrets_either(sandbox_at, monkeypatch):
    from tests.security.conftest import sandbox_backend

    for key, value in CANARIES.items():
        monkeypatch.setenv(key, value)
    backend = sandbox_backend(sandbox_at, slots=1)
    await backend.start()
    try:
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
        await backend.stop()
    text = all_text(msgs)
    assert "PATH" in text
    assert not [k for k, v in CANARIES.items() if v in text]
