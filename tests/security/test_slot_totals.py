"""A slot's totals: many processes each under the per-process limit (or /tmp plus one), a workspace past its quota.

Per-process rlimits do not bound a slot's sum (processes x memory) or its workspace disk; the
slot watchdog (sandbox_server/quota.py) does. Played by a scripted model through the agent loop,
against real sandbox_server and bubblewrap, under outer limits so a regression stays contained.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import pytest

from backends.docker import DATA_DIR
from tests.security.conftest import outer_memory_limit, outer_process_limit, play, running_sandbox, sandbox_container
from tests.support.docker_engine import SandboxPlace, container_exec

MiB = 1024 * 1024
# Five processes of ~70 MiB each: every one far below the 256 MiB per-process limit, 350 MiB together.
HOG = "import time; b = b'x' * (60 * 2**20); time.sleep(12)"
# The same, each first made non-dumpable: /proc then shows its files as root's, hiding its uid from a plain stat.
HIDDEN_HOG = "import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); " + HOG
HOGS = 'for i in 1 2 3 4 5; do python3 -c "{}" & done; wait; echo all-survived'
# One ~70 MiB process next to 150 MiB in /tmp: the tmpfs is memory too, though no process maps it.
TMP_AND_HOG = f'head -c 150M /dev/zero > /tmp/fill && python3 -c "{HOG}"; echo all-survived'
# ~110 MiB in the other slot: under that slot's own total, so it must live.
NEIGHBOUR = "python3 -c \"import time; b = b'x' * (100 * 2**20); time.sleep(6); print('b-alive')\""


def du(out: str) -> int:
    return int(out.split()[0])


@pytest.mark.parametrize(
    "command",
    [HOGS.format(HOG), HOGS.format(HIDDEN_HOG), TMP_AND_HOG],
    ids=["processes", "non-dumpable-processes", "tmp-and-process"],
)
async def test_many_processes_over_the_slot_total_are_killed_and_the_other_slot_lives(sandbox_at, command):
    limits = {
        "max_memory_bytes": 256 * MiB,
        "slot_memory_bytes": 200 * MiB,
        "max_processes": 64,
        "tmp_bytes": 256 * MiB,
    }
    with outer_process_limit(1000), outer_memory_limit(8 * 1024 * MiB):
        async with running_sandbox(sandbox_at, limits=limits) as backend:
            async with backend.trajectory("hogs") as a, backend.trajectory("neighbour") as b:
                hogs = asyncio.create_task(
                    play(
                        a,
                        [
                            [("terminal", {"command": command, "timeout": 40})],
                            [("terminal", {"command": "echo again"})],
                        ],
                    )
                )
                await asyncio.sleep(1)
                neighbour = await b.exec(NEIGHBOUR, timeout=40, max_output_bytes=1000)
                pings = [await b.exec(f"echo ok-{i}", timeout=20, max_output_bytes=100) for i in range(3)]
                msgs = await hogs
                health = await backend.client(a.slot).health()
    killed, again = msgs[0]["content"], msgs[1]["result"]
    assert "all-survived" not in killed
    assert "memory" in killed and "killed" in killed and "200 MiB" in killed, killed
    assert again["output"] == "again\n" and again["exit_code"] == 0  # the slot works again afterwards
    assert neighbour.exit_code == 0 and neighbour.output == "b-alive\n", neighbour
    assert [p.output for p in pings] == ["ok-0\n", "ok-1\n", "ok-2\n"]
    enforced = health["enforced"]
    assert enforced["slot_memory_bytes"]["value"] == 200 * MiB
    assert enforced["watchdog"]["interval_s"] > 0 and "uid" in enforced["watchdog"]["mechanism"]
    assert enforced["watchdog"]["running"] is True


async def test_filling_the_workspace_from_the_terminal_is_stopped_and_trimmed(sandbox_at, tmp_path):
    limits = {"workspace_bytes": 64 * MiB}
    # Links whose text names a host path: the server's walk and trim must neither count nor remove what they point at.
    host = tmp_path / "host"
    host.mkdir()
    with open(host / "big.bin", "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 100 * MiB)
    links = f"ln -s {host} hostdir && ln -s {host}/big.bin hostfile && echo linked"
    fill = "for i in $(seq 40); do dd if=/dev/zero of=junk$i bs=1M count=8 status=none || break; done; echo wrote-all"
    with outer_process_limit(1000), outer_memory_limit(8 * 1024 * MiB):
        async with running_sandbox(sandbox_at, limits=limits) as backend:
            async with backend.trajectory("filler") as ex:
                msgs = await play(
                    ex,
                    [
                        [("write_file", {"path": "keep.txt", "content": "precious"})],
                        [("terminal", {"command": links})],
                        [("terminal", {"command": fill, "timeout": 60})],
                        [("terminal", {"command": "fallocate -l 200M blob && echo fallocated"})],
                        [("terminal", {"command": "du -s --block-size=1 .; cat keep.txt; ls"})],
                    ],
                )
                health = await backend.client(ex.slot).health()
    assert "linked" in msgs[1]["content"]
    loop_msg, blob_msg, after = msgs[2]["content"], msgs[3]["content"], msgs[4]["result"]["output"]
    assert "wrote-all" not in loop_msg and "disk quota of 64 MiB" in loop_msg and "junk" in loop_msg, loop_msg
    assert "fallocated" not in blob_msg and "disk quota" in blob_msg and "blob" in blob_msg, blob_msg
    assert du(after) <= 64 * MiB, after
    assert "precious" in after and "blob" not in after.split()
    assert health["enforced"]["workspace_bytes"]["value"] == 64 * MiB
    assert (host / "big.bin").stat().st_blocks * 512 == 100 * MiB


async def test_space_freed_elsewhere_on_the_filesystem_does_not_hide_a_slots_growth(sandbox_at):
    """The server decides whether to walk from the filesystem's growth: a file on the same filesystem
    deleted after the slot's baseline (other slots' resets, containers, image layers do this) must not
    let 48 MiB and a too-deep tree through a 16 MiB quota. The freed file shares the data dir's disk:
    beside the local backend's data root, or in the container's own filesystem (made and removed as root
    through `docker exec`), whose data dir is on it too."""
    deep = "python3 -c \"import os\nfor _ in range(300): os.mkdir('x'); os.chdir('x')\"; "
    grow = deep + "head -c 48M /dev/zero > big && echo wrote-big"
    with outer_process_limit(1000), outer_memory_limit(8 * 1024 * MiB):
        # No watchdog tick within the command (it may catch the tree before the 48 MiB are written, and
        # no tick may come in time anyway): the check as the command ends is the one under test.
        limits = {"workspace_bytes": 16 * MiB, "watchdog_interval_s": 60}
        async with running_sandbox(sandbox_at, slots=1, limits=limits) as backend:
            free_elsewhere = await _elsewhere(sandbox_at, backend, 128 * MiB)
            async with backend.trajectory("baseline"):
                pass  # its reset takes the slot's baseline with the file still there
            async with backend.trajectory("grower") as ex:
                await free_elsewhere()  # after the slot's baseline, before its command: the filesystem shrinks on net
                msgs = await play(
                    ex,
                    [
                        [("terminal", {"command": grow, "timeout": 60})],
                        [("terminal", {"command": "du -s --block-size=1 ."})],
                    ],
                )
    grew, after = msgs[0]["content"], msgs[1]["result"]["output"]
    assert "wrote-big" not in grew and "disk quota of 16 MiB" in grew and "levels" in grew, grew
    assert du(after) <= 16 * MiB, after


async def _elsewhere(place: SandboxPlace, backend, size: int) -> Callable[[], Awaitable[None]]:
    """Allocate `size` bytes on the slots' filesystem outside any workspace; returns what frees them."""
    where = sandbox_container(backend)
    if where is None:
        elsewhere = place.tmp_path / "elsewhere.bin"
        with open(elsewhere, "wb") as fh:
            os.posix_fallocate(fh.fileno(), 0, size)

        async def free() -> None:
            elsewhere.unlink()

        return free
    path = f"{os.path.dirname(DATA_DIR)}/hermes-elsewhere.bin"
    same_fs = f"fallocate -l {size} {path} && test $(stat -c %d {path}) = $(stat -c %d {DATA_DIR}/slots/0)"
    code, out = await asyncio.to_thread(container_exec, *where, ["sh", "-c", same_fs])
    assert code == 0, out

    async def free_in_container() -> None:
        code, out = await asyncio.to_thread(container_exec, *where, ["rm", path])
        assert code == 0, out

    return free_in_container


async def test_write_file_and_patch_past_the_disk_quota_are_refused(sandbox_at):
    limits = {"workspace_bytes": 1 * MiB}  # small: the scripted model server takes requests up to 1 MiB
    with outer_process_limit(1000), outer_memory_limit(8 * 1024 * MiB):
        async with running_sandbox(sandbox_at, limits=limits) as backend:
            async with backend.trajectory("writer") as ex:
                msgs = await play(
                    ex,
                    [
                        [("terminal", {"command": "head -c 800K /dev/urandom > data.bin && echo made"})],
                        [("write_file", {"path": "big.txt", "content": "a" * (300 * 1024)})],
                        [("write_file", {"path": "small.txt", "content": "hello"})],
                        [("patch", {"path": "small.txt", "old_string": "hello", "new_string": "b" * (300 * 1024)})],
                        [("terminal", {"command": "du -s --block-size=1 .; ls; cat small.txt"})],
                    ],
                )
    assert "made" in msgs[0]["result"]["output"]
    assert "disk quota" in msgs[1]["content"] and "bytes_written" not in msgs[1]["content"], msgs[1]["content"]
    assert msgs[2]["result"] == {"path": "small.txt", "bytes_written": 5}
    assert "disk quota" in msgs[3]["content"] and "replacements" not in msgs[3]["content"], msgs[3]["content"]
    after = msgs[4]["result"]["output"]
    assert du(after) <= 1 * MiB and "big.txt" not in after and after.rstrip().endswith("hello"), after
