"""Resources a slot could take past its limits: SysV/POSIX shared memory, inodes, path depth.

Played by a scripted model through the agent loop, against real sandbox_server and bubblewrap
(and the local workspace backend for the deep tree), under outer limits so a regression stays
contained.
"""

from __future__ import annotations

import asyncio
import os

from slots.executor import ExecPolicy
from environments.tool_backend import LocalToolBackend, LocalToolBackendConfig
from tests.security.conftest import outer_memory_limit, outer_process_limit, play, running_sandbox, server_listdir

MiB = 1024 * 1024
# Three 150 MiB SysV segments, each filled then detached (never IPC_RMID): the process ends, the pages stay.
SYSV_SEGMENTS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
made = 0
for size in (150, 150, 150, 300):
    sid = libc.shmget(0, size << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if sid < 0:
        print(f"shmget {size} MiB:", os.strerror(ctypes.get_errno()))
        continue
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 1, size << 20)
    libc.shmdt(addr)
    made += 1
print("made", made)
"""
# What is left in the slot's IPC namespace afterwards, and its limits there.
IPC_LEFT = (
    "tail -n +2 /proc/sysvipc/shm | wc -l; "
    "cat /proc/sys/kernel/shm_rmid_forced /proc/sys/kernel/shmall /proc/sys/kernel/msgmni; "
    "echo x > /dev/shm/posix 2>&1 || echo no-posix-shm"
)
# A tree 1,200 directories deep (past Python's recursion limit) made from the terminal (chdir, so no path is ever long), then 48 MiB next to it.
DEEP_TREE = (
    "python3 -c \"import os\nfor _ in range(1200): os.mkdir('x'); os.chdir('x')\nopen('f', 'w').write('deep')\" && "
    "head -c 48M /dev/zero > big && echo wrote-deep"
)


async def test_sysv_shared_memory_does_not_outlive_the_command_or_exceed_the_slot_total(sandbox_at):
    limits = {"slot_memory_bytes": 200 * MiB, "max_memory_bytes": 1024 * MiB}
    with outer_process_limit(1000), outer_memory_limit(8 * 1024 * MiB):
        async with running_sandbox(sandbox_at, limits=limits) as backend:
            # The trajectory may ask for network (a task with allow_internet), so the networked path is checked too.
            async with backend.trajectory("shm", ExecPolicy(network=True)) as ex:
                msgs = await play(
                    ex,
                    [
                        [("python", {"code": SYSV_SEGMENTS})],
                        [("terminal", {"command": IPC_LEFT})],
                    ],
                )
                # A command that asks for network runs in a namespace of its own: the same limits there.
                networked = await ex.exec(IPC_LEFT, timeout=20, max_output_bytes=1000, network=True)
    assert networked.output.split()[1:4] == ["1", str(200 * MiB // os.sysconf("SC_PAGE_SIZE")), "32"], networked
    made, left = msgs[0]["content"], msgs[1]["result"]["output"].split()
    # No segment outlives its last user (shm_rmid_forced), and none is bigger than the slot's memory.
    assert left[0] == "0", (made, left)
    assert left[1] == "1" and int(left[2]) * os.sysconf("SC_PAGE_SIZE") <= 200 * MiB, left
    assert "shmget 300 MiB" in made, made
    assert int(left[3]) <= 64, left  # SysV message queues: each holds kernel memory no watchdog sees
    assert left[-1] == "no-posix-shm", left


async def test_many_empty_files_trip_the_workspace_file_limit(sandbox_at):
    limits = {"workspace_bytes": 8 * MiB, "workspace_files": 1_000}
    make = "python3 -c \"import os\nos.mkdir('d')\nfor i in range(20000): open(f'd/{i}', 'w').close()\"; echo made-all"
    with outer_process_limit(1000), outer_memory_limit(8 * 1024 * MiB):
        async with running_sandbox(sandbox_at, limits=limits) as backend:
            async with backend.trajectory("inodes") as ex:
                msgs = await play(
                    ex,
                    [
                        [("write_file", {"path": "keep.txt", "content": "precious"})],
                        [("terminal", {"command": make, "timeout": 60})],
                        [("terminal", {"command": "find . -mindepth 1 | wc -l; cat keep.txt"})],
                    ],
                )
                health = await backend.client(ex.slot).health()
    over, after = msgs[1]["content"], msgs[2]["result"]["output"].split()
    assert "made-all" not in over and "1000 files" in over, over
    assert int(after[0]) <= 1_000 and after[1] == "precious", after
    assert health["enforced"]["workspace_files"]["value"] == 1_000
    assert health["enforced"]["ipc"]["value"]["shm_rmid_forced"] == "1"


async def test_a_very_deep_tree_is_refused_or_removed_and_the_other_slot_is_untouched(sandbox_at, tmp_path):
    limits = {"workspace_bytes": 16 * MiB}
    with outer_process_limit(1000), outer_memory_limit(8 * 1024 * MiB):
        async with running_sandbox(sandbox_at, limits=limits) as backend:
            sandboxes = set(backend._sandboxes)
            async with backend.trajectory("innocent") as b:
                innocent = asyncio.create_task(b.exec("sleep 4; echo innocent-ok", timeout=60, max_output_bytes=100))
                async with backend.trajectory("deep") as a:
                    msgs = await play(
                        a,
                        [
                            [("write_file", {"path": "x/" * 3000 + "f", "content": "deep"})],
                            [("terminal", {"command": DEEP_TREE, "timeout": 60})],
                            [("terminal", {"command": "du -s --block-size=1 .; ls"})],
                        ],
                    )
                    slot_index = a.slot.index
                left_after_reset = sorted(await server_listdir(backend, f"slots/{slot_index}"))
                stale = [n for n in await server_listdir(backend, "slots") if "stale" in n]
                done = await innocent
                again = await b.exec("echo still-ok", timeout=20, max_output_bytes=100)
            same_sandbox = set(backend._sandboxes) == sandboxes
        data_left = os.listdir(tmp_path / "sb") if (tmp_path / "sb").exists() else []
    refused, deep, after = msgs[0]["content"], msgs[1]["content"], msgs[2]["result"]["output"]
    assert "bytes_written" not in refused and "levels" in refused, refused
    assert "wrote-deep" not in deep and "levels" in deep, deep
    # The command is stopped at the depth breach: before `big` (whose 48 MiB would then be trimmed as over quota) or
    # while it is being written, under quota (then what was written stays: only a workspace over quota is trimmed).
    assert int(after.split()[0]) <= 16 * MiB, after
    assert left_after_reset == [] and stale == []
    assert same_sandbox and done.output == "innocent-ok\n" and again.output == "still-ok\n", (done, again)
    assert data_left == []


async def test_a_very_deep_tree_on_the_local_backend_is_the_models_error_not_the_runs(tmp_path):
    backend = LocalToolBackend(LocalToolBackendConfig(workspace_root=str(tmp_path / "ws")))
    await backend.start()
    try:
        async with backend.trajectory("deep") as ex:
            msgs = await play(
                ex,
                [
                    [("write_file", {"path": "x/" * 3000 + "f", "content": "deep"})],
                    [("terminal", {"command": DEEP_TREE.replace("48M", "1M"), "timeout": 60})],
                ],
            )
    finally:
        await backend.stop()
    assert "bytes_written" not in msgs[0]["content"] and "levels" in msgs[0]["content"], msgs[0]["content"]
    assert "wrote-deep" in msgs[1]["content"]
    assert os.listdir(tmp_path / "ws") == []  # the deep workspace was removed at the trajectory's end


async def test_a_very_deep_tree_within_the_depth_limit_is_the_models_error_not_the_runs(sandbox_at):
    """The test above on a sandbox slot of each backend. A slot's tree may be as deep as its (highest)
    depth limit: 1,020 directories, past Python's recursion limit and remove_tree's descriptor bound, are
    written, and the slot's reset removes them: the sandbox is neither failed nor replaced."""
    limits = {"max_path_depth": 1024}
    deep = DEEP_TREE.replace("range(1200)", "range(1020)").replace("48M", "1M")
    with outer_process_limit(1000), outer_memory_limit(8 * 1024 * MiB):
        async with running_sandbox(sandbox_at, slots=1, limits=limits) as backend:
            async with backend.trajectory("deep") as ex:
                msgs = await play(
                    ex,
                    [
                        [("write_file", {"path": "x/" * 3000 + "f", "content": "deep"})],
                        [("terminal", {"command": deep, "timeout": 60})],
                        [("terminal", {"command": "find . -type d | wc -l"})],
                    ],
                )
            left_after_reset = await server_listdir(backend, "slots/0")
            stale = [n for n in await server_listdir(backend, "slots") if "stale" in n]
            async with backend.trajectory("next") as ex:
                again = await ex.exec("ls -A; echo ok", timeout=20, max_output_bytes=100)
            replaced = backend.replaced
    assert "bytes_written" not in msgs[0]["content"] and "levels" in msgs[0]["content"], msgs[0]["content"]
    assert "wrote-deep" in msgs[1]["content"], msgs[1]["content"]
    assert msgs[2]["result"]["output"] == "1021\n", msgs[2]  # the workspace and its 1,020 nested directories
    assert left_after_reset == [] and stale == [] and replaced == 0
    assert again.output == "ok\n", again
