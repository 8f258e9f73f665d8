"""A name for a slot's uid: the system's /etc/passwd and /etc/group plus one line each, bound over them read-only.

A slot's uid is one no account has. Every lookup of it (bash looks itself up as it starts; `whoami`, git, pip, ssh)
then misses /etc/passwd and goes on to the next source nsswitch.conf names (systemd's userdb on Debian: a library
loaded and a dozen files and sockets tried per process), and fails. With its own line the lookup ends in the file:
the account `sandbox`, home the workspace. Only the slot's own line is added; the rest is the system's, which the
slot can read anyway.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["slot_identity"]

_PASSWD, _GROUP = Path("/etc/passwd"), Path("/etc/group")


def _ids(text: str, column: int) -> tuple[set[str], set[str]]:
    rows = [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]
    return {r[0] for r in rows}, {r[column] for r in rows if len(r) > column}


def slot_identity(
    data_dir: Path, uid: int, home: str, *, passwd_file: Path = _PASSWD, group_file: Path = _GROUP
) -> list[str]:
    """bwrap arguments binding a passwd and a group file that name `uid` (gid the same) over the system's; none if
    the system has no such files or already names that uid."""
    try:
        passwd, group = passwd_file.read_text(), group_file.read_text()
    except OSError:
        return []
    names, uids = _ids(passwd, 2)
    if str(uid) in uids:
        return []
    name = "sandbox" if "sandbox" not in names else f"sandbox{uid}"
    shell = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"
    lines = {
        "passwd": passwd.rstrip("\n") + f"\n{name}:x:{uid}:{uid}:hermes-rl slot:{home}:{shell}\n",
        "group": group.rstrip("\n") + (f"\n{name}:x:{uid}:\n" if str(uid) not in _ids(group, 2)[1] else "\n"),
    }
    where = data_dir / "identity" / str(uid)
    where.mkdir(parents=True, exist_ok=True)
    args: list[str] = []
    for file, text in lines.items():
        path = where / file
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.chmod(0o644)
            tmp.replace(path)
        args += ["--ro-bind", str(path), f"/etc/{file}"]
    return args
