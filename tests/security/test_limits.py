"""Per-slot limits and users: a fork bomb, a memory hog, a /tmp filler, root inside the slot.

The fork bomb and the memory hog run under an outer limit (a pids cgroup, an address-space
rlimit on everything the test starts) so a regression cannot take the shared machine down.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.security.conftest import outer_memory_limit, outer_process_limit, play, running_sandbox, sandbox_backend

MiB = 1024 * 1024
FORK_BOMB = "bomb() { bomb | bomb & }; bomb; sleep 10; echo bomb-over"


@pytest.mark.slow
async def test_fork_bomb_in_one_slot_leaves_the_other_slot_working(sandbox_at):
    with outer_process_limit(1500):
        async with running_sandbox(sandbox_at, limits={"max_processes": 200}) as backend:
            async with backend.trajectory("bomber") as a, backend.trajectory("innocent") as b:
                bomb = asyncio.create_task(play(a, [[("terminal", {"command": FORK_BOMB, "timeout": 15})]]))
                await asyncio.sleep(2)  # the bomb has filled what it can
                results = []
                for i in range(10):  # spread over the next ~4 s, while the bomb goes on
                    r = await b.exec(f"echo ok-{i}", timeout=20, max_output_bytes=1000)
                    results.append(r)
                    await asyncio.sleep(0.3)
                assert not bomb.done()
                await bomb
            assert [r.output for r in results] == [f"ok-{i}\n" for i in range(10)], [
                r.output for r in results if r.exit_code
            ]
            assert all(r.exit_code == 0 for r in results)


async def test_limits_trip_at_their_configured_values(sandbox_at):
    limits = {
        "max_processes": 40,
        "max_memory_bytes": 256 * MiB,
        "tmp_bytes": 8 * MiB,
        "max_file_bytes": 12 * MiB,
        "max_cpu_s": 1,
    }
    with outer_memory_limit(8 * 1024 * MiB):
        backend = sandbox_backend(sandbox_at, limits=limits)
        await backend.start()
    try:
        async with backend.trajectory("hog") as ex:
            msgs = await play(
                ex,
                [
                    [
                        ("python", {"code": "b = b'x' * (100 * 2**20); print('100MiB ok')"}),
                        ("python", {"code": "b = b'x' * (400 * 2**20); print('400MiB ok')"}),
                        (
                            "terminal",
                            {"command": "for i in $(seq 60); do sleep 5 & done 2>&1 | sort | uniq -c; jobs | wc -l"},
                        ),
                        (
                            "terminal",
                            {"command": "dd if=/dev/zero of=/tmp/f bs=1M count=32 2>&1 | head -1; stat -c %s /tmp/f"},
                        ),
                        ("terminal", {"command": "head -c 20M /dev/zero > big; echo rc=$?; stat -c %s big"}),
                        ("terminal", {"command": "python3 -c 'while True: pass'; echo rc=$?", "timeout": 20}),
                    ]
                ],
            )
        out = [m["result"].get("output", "") for m in msgs]
        assert "100MiB ok" in out[0]
        assert "MemoryError" in out[1] and "400MiB ok" not in out[1]
        assert "Resource temporarily unavailable" in out[2] and int(out[2].split()[-1]) < 40
        assert "No space left on device" in out[3] and out[3].split()[-1] == str(8 * MiB)
        assert out[4].split()[-1] == str(12 * MiB) and "rc=153" in out[4]  # SIGXFSZ
        assert "rc=152" in out[5]  # SIGXCPU after 1 s of CPU
        health = await backend.client(ex.slot).health()
        enforced = health["enforced"]
        assert enforced["max_processes"]["value"] == 40 and enforced["max_memory_bytes"]["value"] == 256 * MiB
        assert enforced["tmp_bytes"]["value"] == 8 * MiB and enforced["cache"] == "read-only"
    finally:
        await backend.stop()


async def test_each_slot_runs_as_an_unprivileged_uid_of_its_own(sandbox):
    async with sandbox.trajectory("a") as a, sandbox.trajectory("b") as b:
        probe = [[("terminal", {"command": "id -u; cat /etc/shadow 2>&1 | head -1; grep CapEff /proc/self/status"})]]
        out_a = (await play(a, probe))[0]["result"]["output"].splitlines()
        out_b = (await play(b, probe))[0]["result"]["output"].splitlines()
    assert out_a[0] != "0" and out_b[0] != "0" and out_a[0] != out_b[0]
    assert "Permission denied" in out_a[1]
    assert out_a[2].endswith("0000000000000000")
