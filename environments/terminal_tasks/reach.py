"""Where a Harbor task's tests find a program by name (docs/security.md, "Programs off the tests' path").

An added file named like the tests' tooling (`python3.13`, `pip`, `pytest`, `uvx`) is a plant only where the
verifier can run it by name: on test.sh's PATH (the pristine image's login shell as root with the task's
environment, and the same without the profiles, as test.sh runs when the agent changed them), in uv's installer
directory (`~/.local/bin`, which published test.sh files source) or `~/.cargo/bin`, among uv's managed Pythons, in
a virtualenv or conda prefix the environment names or a `.venv` uv would discover above the workdir or /tests, or
in a directory the tests' own files name (or one above it, below the top level). A server's own virtualenv under
/opt (pypi-server's oracle) is none of these.

A link defeats a path-based answer: a PATH directory (or one above it) swapped for a link to a directory off the
PATH shows in the engine's diff as a change with nothing added or changed below it. Where any of the reachable
directories looks like that, or the PATH holds an empty or relative entry (the current directory), every added
program with a tool's name stays a suspect.
"""

from __future__ import annotations

import posixpath

from backends.task_container import TaskContainer

__all__ = ["TOOL_FLAG", "off_the_tests_path"]

TOOL_FLAG = "(a program the tests run by name)"  # integrity_flags' line for an added program with a tool's name

# After a marker: a profile of the image may print a banner first.
_MARK = "hermes-reach-probe"
_PROBE = (
    f'printf "%s\\n" {_MARK} "$PATH" "$HOME" "$XDG_DATA_HOME" "$UV_PYTHON_INSTALL_DIR" "$VIRTUAL_ENV" "$CONDA_PREFIX"'
)


def _above(path: str) -> list[str]:
    """`path` and every directory above it, but not the root."""
    out = []
    while path not in ("/", ""):
        out.append(path)
        path = posixpath.dirname(path)
    return out


async def off_the_tests_path(
    pristine: TaskContainer,
    changes: dict[str, str],
    programs: list[str],
    env: dict[str, str],
    workdir: str,
    tests_text: str,
) -> set[str]:
    """Of `programs` (added, named like the tests' tooling), those no test can run by name; empty when unsure."""
    dirs: set[str] = set()
    roots: set[str] = set()
    for login in (True, False):
        probe = await pristine.exec(_PROBE, timeout=120, user="root", workdir=workdir, env=env, login=login)
        lines = probe.output.rpartition(_MARK + "\n")[2].split("\n")
        if probe.exit_code != 0 or _MARK not in probe.output or len(lines) < 6:
            return set()
        path, home, data_home, uv_pythons, venv, conda = lines[:6]
        entries = path.split(":")
        if any(not e.startswith("/") for e in entries):  # "" or "." is the current directory: anything may be run
            return set()
        dirs |= {posixpath.normpath(e) for e in entries}
        for h in {home or "/root", "/root"}:
            dirs |= {f"{h}/.local/bin", f"{h}/.cargo/bin"}
            roots.add(f"{h}/.local/share/uv")
        roots |= {posixpath.normpath(r) for r in (f"{data_home}/uv" if data_home else "", uv_pythons, venv, conda) if r}
    roots |= {f"{a}/.venv" for start in (workdir, "/tests") for a in ["", *_above(start)]}
    # A directory the diff shows changed with nothing added or changed below it may now be a link elsewhere.
    filled = {a for p, kind in changes.items() if kind != "deleted" for a in _above(posixpath.dirname(p))}
    if any(a in changes and a not in filled for d in dirs | roots for a in _above(d)):
        return set()
    return {
        p
        for p in programs
        if posixpath.dirname(p) not in dirs
        and not any(p.startswith(r + "/") for r in roots)
        and not _named(posixpath.dirname(p), tests_text)
    }


def _named(directory: str, text: str) -> bool:
    """Whether the tests' files name `directory` or a directory above it below the top level (`/opt/conda` for
    `/opt/conda/bin`: a test sourcing `/opt/conda/etc/profile.d/conda.sh` puts that `bin` on its PATH)."""
    return any(d in text for d in _above(directory) if d.count("/") >= 2)
