"""A slot's uid has a name (sandbox_server/identity.py): looked up in /etc/passwd, not in every other source
nsswitch.conf lists; the files stay read-only and keep the system's own accounts."""

from __future__ import annotations

from pathlib import Path

from sandbox_server.identity import slot_identity


async def test_a_slot_user_is_named_with_the_workspace_as_home(client):
    result = await client.exec(
        "0",
        'id -un; id -gn; getent passwd "$(id -u)"; getent passwd root | cut -d: -f1; '
        "(echo x >> /etc/passwd) 2>/dev/null && echo WROTE; (echo x >> /etc/group) 2>/dev/null && echo WROTE",
        timeout=30,
        max_output_bytes=10_000,
    )
    lines = result.output.splitlines()
    assert lines[:2] == ["sandbox", "sandbox"], result.output
    name, _, uid, gid, _, home, shell = lines[2].split(":")
    assert (name, uid == gid, home) == ("sandbox", True, "/workspace"), lines[2]
    assert shell in ("/bin/bash", "/bin/sh")
    assert lines[3] == "root"
    assert "WROTE" not in result.output
    # each slot has a uid of its own, named in its own view only
    other = await client.exec("1", "id -u; id -un", timeout=30, max_output_bytes=1000)
    other_uid, other_name = other.output.split()
    assert other_uid != uid and other_name == "sandbox"


def _system(tmp_path: Path, passwd: str, group: str = "root:x:0:\n") -> tuple[Path, Path]:
    (tmp_path / "passwd").write_text(passwd)
    (tmp_path / "group").write_text(group)
    return tmp_path / "passwd", tmp_path / "group"


def test_an_account_the_system_already_has_is_left_alone(tmp_path):
    passwd, group = _system(tmp_path, "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\n")
    assert slot_identity(tmp_path / "data", 1000, "/workspace", passwd_file=passwd, group_file=group) == []


def test_a_taken_name_gets_the_uid_and_the_system_lines_stay(tmp_path):
    passwd, group = _system(tmp_path, "root:x:0:0:root:/root:/bin/bash\nsandbox:x:5:5::/:/bin/sh\n")
    args = slot_identity(tmp_path / "data", 4242, "/home/user", passwd_file=passwd, group_file=group)
    assert args[0::3] == ["--ro-bind", "--ro-bind"] and args[2::3] == ["/etc/passwd", "/etc/group"]
    written = Path(args[1]).read_text().splitlines()
    assert written[:2] == passwd.read_text().splitlines()
    assert written[2].startswith("sandbox4242:x:4242:4242:") and ":/home/user:" in written[2]
    assert Path(args[4]).read_text().splitlines() == ["root:x:0:", "sandbox4242:x:4242:"]
    # made once; the same arguments again
    assert slot_identity(tmp_path / "data", 4242, "/home/user", passwd_file=passwd, group_file=group) == args
