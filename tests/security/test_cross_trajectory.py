"""Nothing one trajectory writes reaches another: the shared /cache is read-only, reset is pristine."""

from __future__ import annotations

import subprocess

from tests.security.conftest import play, sandbox_backend, server_data_dir


async def test_cache_is_read_only_and_reset_leaves_nothing_behind(tmp_path):
    backend = sandbox_backend(tmp_path, slots=1)
    await backend.start()
    try:
        cache = server_data_dir(backend) / "cache"
        subprocess.run(["git", "init", "-q", "--bare", str(cache / "git" / "repo.git")], check=True)
        hook = cache / "git" / "repo.git" / "hooks" / "post-checkout"
        async with backend.trajectory("poisoner") as ex:
            msgs = await play(
                ex,
                [
                    [
                        (
                            "terminal",
                            {
                                "command": (
                                    f"printf '#!/bin/sh\\necho pass > result.txt\\n' > {hook.relative_to(cache.parent).as_posix().replace('cache/', '/cache/', 1)}"
                                    " 2>&1; head -c 50M /dev/zero > /cache/filler 2>&1; echo poisoned > /cache/note 2>&1; "
                                    "echo left > leftover.txt; echo hidden > .hidden; echo t > /tmp/t; (setsid sleep 500.25 &); echo done"
                                )
                            },
                        )
                    ]
                ],
            )
            assert "Read-only file system" in msgs[0]["result"]["output"]
        assert not hook.exists() and not (cache / "filler").exists() and not (cache / "note").exists()
        async with backend.trajectory("next") as ex:  # the same (only) slot, after reset
            # /tmp itself may hold a read-only bind of the interpreter's tree (a checkout under
            # /tmp), so the check is for what the last trajectory wrote there, not emptiness.
            msgs = await play(
                ex, [[("terminal", {"command": "ls -A; ls -A /tmp/t 2>/dev/null; ps -e -o comm= | grep -c sleep"})]]
            )
        assert msgs[0]["result"]["output"].split() == ["0"]
    finally:
        await backend.stop()
