"""Nothing one trajectory writes reaches another: the shared /cache is read-only, reset is pristine.

Runs on each sandbox backend (`sandbox_at`): local processes and docker containers.
"""

from __future__ import annotations

from tests.security.conftest import play, running_sandbox, server_listdir, server_makedirs

HOOKS = "cache/git/repo.git/hooks"  # a bare repository's hooks in the server's shared cache


async def test_cache_is_read_only_and_reset_leaves_nothing_behind(sandbox_at):
    async with running_sandbox(sandbox_at, slots=1) as backend:
        await server_makedirs(backend, HOOKS)
        async with backend.trajectory("poisoner") as ex:
            msgs = await play(
                ex,
                [
                    [
                        (
                            "terminal",
                            {
                                "command": (
                                    f"printf '#!/bin/sh\\necho pass > result.txt\\n' > /{HOOKS}/post-checkout"
                                    " 2>&1; head -c 50M /dev/zero > /cache/filler 2>&1; echo poisoned > /cache/note 2>&1; "
                                    "echo left > leftover.txt; echo hidden > .hidden; echo t > /tmp/t; (setsid sleep 500.25 &); echo done"
                                )
                            },
                        )
                    ]
                ],
            )
            assert "Read-only file system" in msgs[0]["result"]["output"]
        assert await server_listdir(backend, HOOKS) == []
        assert sorted(await server_listdir(backend, "cache")) == ["git"]
        async with backend.trajectory("next") as ex:  # the same (only) slot, after reset
            # /tmp itself may hold a read-only bind of the interpreter's tree (a checkout under
            # /tmp), so the check is for what the last trajectory wrote there, not emptiness.
            msgs = await play(
                ex, [[("terminal", {"command": "ls -A; ls -A /tmp/t 2>/dev/null; ps -e -o comm= | grep -c sleep"})]]
            )
        assert msgs[0]["result"]["output"].split() == ["0"]
