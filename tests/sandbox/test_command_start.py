"""How a slot's exec server starts a command: nothing of the server's privileges, descriptors or limits leaks.

Run for both ways a command starts: the compiled hermes-spawn helper, and prlimit + setpriv
(`--no-spawn-helper`, what a server without the helper built uses).
"""

from __future__ import annotations

import pytest

from backends.process import start_sandbox_process
from sandbox_server.isolation import SPAWN_HELPER
from slots.client import SandboxAddress, SandboxClient

PROBE = (
    "grep -E '^(Uid|Gid|Groups|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status; "
    "ls /proc/$$/fd > /tmp/fds; echo fds $(cat /tmp/fds); "
    "echo limits $(ulimit -Hu) $(ulimit -Hv) $(ulimit -Ht) $(ulimit -Hn) $(ulimit -Hc); "
    "echo session $(($(cut -d' ' -f6 /proc/$$/stat) == $$))"
)


@pytest.mark.parametrize("helper", [True, False], ids=["hermes-spawn", "prlimit-setpriv"])
async def test_a_command_starts_unprivileged_with_only_its_own_descriptors(tmp_path, http, helper):
    if helper and not SPAWN_HELPER.exists():
        pytest.fail(f"{SPAWN_HELPER} is not built; run scripts/setup.sh")
    extra = ["--max-processes", "77", "--max-memory-bytes", str(300 * 2**20), "--max-cpu-s", "33"]
    proc = await start_sandbox_process(
        data_dir=tmp_path / "sb", slots=2, extra_args=extra + ([] if helper else ["--no-spawn-helper"])
    )
    try:
        client = SandboxClient(SandboxAddress("t", proc.url, proc.token), http)
        health = await client.health()
        assert health["enforced"]["command_start"] == ("hermes-spawn" if helper else "prlimit + setpriv")
        # The syscall filter comes with hermes-spawn; without it /health says so, and why.
        assert health["enforced"]["syscall_filter"] == (
            {"enforced": True, "how": health["enforced"]["syscall_filter"]["how"]}
            if helper
            else {"enforced": False, "how": "not enforced: the server was started with --no-spawn-helper"}
        )
        short = await client.exec("0", PROBE, timeout=20, max_output_bytes=10_000)
        # A command too long for argv reaches bash as fd 3, which its first line closes: bash reads on from its
        # own copy (255, close-on-exec), so nothing the command starts can read or rewrite the rest of the script.
        long = await client.exec("1", PROBE + "\n#" + "x" * 200_000, timeout=20, max_output_bytes=10_000)
    finally:
        await proc.stop()
    # long: 255 is bash's own copy of the script; fd 3 is closed
    for result, fds in ((short, "0 1 2"), (long, "0 1 2 255")):
        assert result.exit_code == 0, result.output
        lines = {words[0]: words[1:] for words in map(str.split, result.output.splitlines()) if len(words) > 1}
        uid = lines["Uid:"][0]
        assert uid != "0" and lines["Uid:"] == [uid] * 4 and lines["Gid:"] == [uid] * 4, result.output
        assert "Groups:" not in lines  # no supplementary groups (the line is empty)
        for cap in ("CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"):
            assert lines[cap] == ["0000000000000000"], result.output
        assert lines["NoNewPrivs:"] == ["1"]
        assert lines["Seccomp:"] == (["2"] if helper else ["0"])  # 2: a filter in force
        assert " ".join(lines["fds"]) == fds, result.output  # nothing of the exec server's (sockets, /dev/null)
        assert lines["limits"] == ["77", str(300 * 1024), "38", "1024", "0"]
        assert lines["session"] == ["1"]  # a session leader: no terminal to inject keystrokes into
