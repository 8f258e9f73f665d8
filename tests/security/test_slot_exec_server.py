"""The slot's long-lived namespace and its exec server: out of the commands' reach, and pristine after reset."""

from __future__ import annotations

import asyncio

from tests.security.conftest import play, sandbox_backend


async def test_commands_cannot_kill_or_inspect_the_exec_server(sandbox):
    attack = (
        "for p in $(pgrep -u 0); do kill -9 $p 2>/dev/null && "
        "echo KILLED $p; done; "
        "for p in $(pgrep -u 0); do ls /proc/$p/fd >/dev/null 2>&1 && echo FDS $p; "
        "cat /proc/$p/environ >/dev/null 2>&1 && echo ENV $p; done; "
        "ls /.hermes-keep 2>/dev/null && echo KEEP; echo roots $(pgrep -u 0 | wc -l); echo attacked"
    )
    async with sandbox.trajectory("a") as ex:
        msgs = await play(
            ex,
            [
                [("terminal", {"command": attack})],
                [("terminal", {"command": "sleep 30", "timeout": 1})],
                [("terminal", {"command": "echo still-here; id -u"})],
            ],
        )
    out = [m["result"].get("output", "") for m in msgs]
    assert (
        out[0].endswith("attacked\n")
        and "KILLED" not in out[0]
        and "FDS" not in out[0]
        and "ENV" not in out[0]
        and "KEEP" not in out[0]
    )
    assert msgs[1]["result"].get("exit_code") != 0  # timed out
    assert out[2].startswith("still-here\n") and out[2].split()[-1] != "0"


async def test_ipc_tmp_and_processes_of_a_trajectory_do_not_survive_reset(sandbox_at):
    # A message queue: shared memory does not outlive its last user at all (test_slot_resources.py).
    backend = sandbox_backend(sandbox_at, slots=1)
    await backend.start()
    try:
        async with backend.trajectory("first") as ex:
            first = await play(
                ex,
                [
                    [
                        (
                            "terminal",
                            {
                                "command": "ipcmk -Q >/dev/null; ipcs -q | grep -c '^0x'; echo t > /tmp/t; "
                                "(setsid nohup sleep 501.5 >/dev/null 2>&1 &); echo ok"
                            },
                        )
                    ]
                ],
            )
            assert first[0]["result"]["output"].split() == ["1", "ok"]
        async with backend.trajectory("second") as ex:  # the same (only) slot, after reset
            msgs = await play(
                ex,
                [
                    [
                        (
                            "terminal",
                            {
                                "command": "ipcs -q | grep -c '^0x'; ls /tmp/t 2>&1 | grep -c 'No such'; pgrep -c -f 'sleep 501'"
                            },
                        )
                    ]
                ],
            )
        assert msgs[0]["result"]["output"].split() == ["0", "1", "0"]
    finally:
        await backend.stop()


async def test_orphans_are_reaped_while_the_command_runs(sandbox_at):
    # 120 double-forked children in one command under a 40-process limit: each is reaped as it
    # dies, so none of them fails to start (zombies count against the limit).
    backend = sandbox_backend(sandbox_at, slots=1, limits={"max_processes": 40})
    await backend.start()
    try:
        async with backend.trajectory("orphans") as ex:
            msgs = await play(
                ex, [[("terminal", {"command": "for i in $(seq 120); do (true &); sleep 0.005; done 2>&1; echo done"})]]
            )
        assert msgs[0]["result"]["output"] == "done\n"
    finally:
        await backend.stop()


async def test_a_slot_in_one_container_cannot_use_up_the_process_limit_of_a_slot_in_another(
    docker_sandbox_image, docker_test_id, tmp_path
):
    # RLIMIT_NPROC counts a uid's processes across the whole machine: slots of two containers that
    # got the same uid would share one process budget, so one trajectory could starve another.
    from tests.support.docker_engine import SandboxPlace

    place = SandboxPlace(tmp_path, "docker", docker_sandbox_image, docker_test_id)
    a = sandbox_backend(place, slots=1, limits={"max_processes": 40})
    b = sandbox_backend(place, slots=1, limits={"max_processes": 40})
    await a.start()
    await b.start()
    try:
        async with a.trajectory("hog") as ex_a, b.trajectory("victim") as ex_b:
            hog = asyncio.create_task(
                ex_a.exec(
                    "for i in $(seq 30); do sleep 20 & done; sleep 1; echo held; wait",
                    timeout=60,
                    max_output_bytes=1000,
                )
            )
            await asyncio.sleep(3)  # the hog's 30 sleepers are running
            victim = await ex_b.exec(
                "for i in $(seq 20); do sleep 1 & done; wait; echo victim-ok", timeout=60, max_output_bytes=1000
            )
            hog.cancel()
        uids = {(await s.client(s.slots()[0]).health())["enforced"]["uid"] for s in (a, b)}
    finally:
        await asyncio.gather(a.stop(), b.stop())
    assert victim.output.endswith("victim-ok\n") and "errno" not in victim.output, victim.output
    assert len(uids) == 2, uids  # each container's slots have uids of their own
