"""Critical: file tools raced out of the workspace, FIFOs freezing the server, the server's token.

The attack that worked before: a dozen read_file calls on FIFOs parked the server's thread
pool in open(); paths checked on the event loop were opened later in the pool, after a
terminal call had swapped them for symlinks to host files.
"""

from __future__ import annotations

import asyncio
import os
import time

from tests.security.conftest import all_text, play, server_token, sigterm_server
from tools.executor import LocalWorkspace

CANARY = "CANARY-host-secret-5b1f"

SETUP = (
    "for i in $(seq 0 11); do mkfifo f$i; done; echo innocent > x; echo innocent > y; echo innocent > z; "
    "echo innocent > w; ls | wc -l"
)


def swap(host_secret, host_target) -> str:
    # Wait until the server has checked the paths, swap them for links to host files, then
    # feed the FIFOs so the parked reads (and the queued ones behind them) go on.
    return (
        f"sleep 1.5; ln -sfn {host_secret} x.l && mv -T x.l x; ln -sfn {host_target} y.l && mv -T y.l y; "
        "ln -sfn /proc/self/environ z.l && mv -T z.l z; ln -sfn /etc/shadow w.l && mv -T w.l w; "
        'for i in $(seq 0 11); do (timeout 4 sh -c "echo > f$i" 2>/dev/null &) ; done; sleep 4.5; echo swapped'
    )


def attack_turns(host_secret, host_target):
    fifo_reads = [("read_file", {"path": f"f{i}"}) for i in range(12)]
    return [
        [("terminal", {"command": SETUP})],
        fifo_reads
        + [
            ("read_file", {"path": "x"}),
            ("write_file", {"path": "y", "content": "PWNED by the agent"}),
            ("read_file", {"path": "z"}),
            ("read_file", {"path": "w"}),
            ("terminal", {"command": swap(host_secret, host_target), "timeout": 20}),
        ],
        # and the plain, unraced attempts
        [
            ("terminal", {"command": f"ln -sfn {host_secret} s1; mkdir -p d; ln -sfn {host_secret.parent} d2"}),
        ],
        [
            ("read_file", {"path": "s1"}),
            ("read_file", {"path": "d2/" + host_secret.name}),
            ("write_file", {"path": "d2/new.txt", "content": "PWNED"}),
            ("read_file", {"path": "/proc/self/environ"}),
        ],
    ]


def host_files(tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    secret = host / "secret.txt"
    secret.write_text(CANARY)
    target = host / "target.txt"
    target.write_text("original")
    return secret, target


async def test_sandbox_file_tools_cannot_be_raced_onto_host_files(sandbox, tmp_path):
    secret, target = host_files(tmp_path)
    token = server_token(sandbox)
    t0 = time.monotonic()
    async with sandbox.trajectory("attacker") as executor:
        msgs = await play(executor, attack_turns(secret, target))
    text = all_text(msgs)
    assert CANARY not in text
    assert token not in text
    assert "root:" not in text  # /etc/shadow
    assert target.read_text() == "original"
    assert not (secret.parent / "new.txt").exists()
    # the FIFO reads were refused at once, with a message saying why
    fifo_results = [m["result"] for m in msgs[1:13]]
    assert all("not a regular file" in r.get("error", "") for r in fifo_results), fifo_results
    assert time.monotonic() - t0 < 60


async def test_local_file_tools_cannot_be_raced_onto_host_files(tmp_path):
    secret, target = host_files(tmp_path)
    ws = LocalWorkspace(tmp_path / "ws")
    msgs = await asyncio.wait_for(play(ws, attack_turns(secret, target)), 90)
    text = all_text(msgs)
    assert CANARY not in text
    assert target.read_text() == "original"
    assert not (secret.parent / "new.txt").exists()
    assert all("not a regular file" in m["result"].get("error", "") for m in msgs[1:13])


async def test_fifo_reads_in_one_slot_do_not_freeze_the_others(sandbox, tmp_path):
    """8 never-fed FIFO reads in slot A; slot B's files, commands and reset still answer; SIGTERM stops the server."""
    async with sandbox.trajectory("a") as a, sandbox.trajectory("b") as b:
        attack = asyncio.create_task(
            play(
                a,
                [
                    [("terminal", {"command": "for i in $(seq 0 7); do mkfifo p$i; done"})],
                    [("read_file", {"path": f"p{i}"}) for i in range(8)] * 2,
                ],
            )
        )
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        for i in range(5):
            await asyncio.wait_for(b.write_file(f"n{i}.txt", b"hi"), 10)
            assert await asyncio.wait_for(b.read_file(f"n{i}.txt"), 10) == b"hi"
        assert (await b.exec("cat n0.txt", timeout=10, max_output_bytes=100)).output == "hi"
        assert time.monotonic() - t0 < 15
        msgs = await asyncio.wait_for(attack, 30)
        assert all("error" in m["result"] for m in msgs[1:])
    # both slots were reset and came back
    assert all(s.state.value == "free" for s in sandbox.slots())
    await sigterm_server(sandbox)


async def test_local_fifo_read_returns_an_error_instead_of_hanging(tmp_path):
    ws = LocalWorkspace(tmp_path / "ws")
    os.mkfifo(ws.root / "pipe")
    msgs = await asyncio.wait_for(
        play(
            ws,
            [
                [
                    ("read_file", {"path": "pipe"}),
                    ("patch", {"path": "pipe", "old_string": "a", "new_string": "b"}),
                    ("write_file", {"path": "pipe", "content": "x"}),
                ]
            ],
        ),
        20,
    )
    assert all("not a regular file" in m["result"].get("error", "") for m in msgs), msgs


async def test_sandbox_token_is_in_no_process_environment(sandbox):
    token = server_token(sandbox).encode()
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    if token in fh.read():
                        found.append(pid)
            except OSError:
                pass
    assert found == []
