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
import re
from dataclasses import dataclass

from backends.task_container import TaskContainer

__all__ = ["TOOL_FLAG", "TestsPath", "above", "shadowing", "tests_path"]

TOOL_FLAG = "(a program the tests run by name)"  # integrity_flags' line for an added program with a tool's name

# After a marker: a profile of the image may print a banner first.
_MARK = "hermes-reach-probe"
_PROBE = (
    f'printf "%s\\n" {_MARK} "$PATH" "$HOME" "$XDG_DATA_HOME" "$UV_PYTHON_INSTALL_DIR" "$VIRTUAL_ENV" "$CONDA_PREFIX"; '
    'IFS=:; for d in $PATH; do ls -1 "$d" 2>/dev/null; done'
)


def above(path: str) -> list[str]:
    """`path` and every directory above it, but not the root."""
    out = []
    while path not in ("/", ""):
        out.append(path)
        path = posixpath.dirname(path)
    return out


@dataclass(frozen=True)
class TestsPath:
    """Where test.sh finds programs by name (the pristine image's view), and the programs it finds there."""

    dirs: frozenset[str]
    roots: tuple[str, ...]
    programs: frozenset[str]  # the names on the pristine image's PATH
    sure: bool  # False: a link may have moved a directory, or PATH searches the current one: everything reaches

    def reaches(self, path: str, tests_text: str) -> bool:
        d = posixpath.dirname(path)
        return (
            not self.sure
            or d in self.dirs
            or any(path.startswith(r + "/") for r in self.roots)
            or _named(d, tests_text)
        )


async def tests_path(pristine: TaskContainer, changes: dict[str, str], env: dict[str, str], workdir: str) -> TestsPath:
    """test.sh's PATH and the other places its tools look, asked of a container of the pristine image."""
    dirs: set[str] = set()
    roots: set[str] = set()
    programs: set[str] = set()
    unsure = TestsPath(frozenset(), (), frozenset(), sure=False)
    for login in (True, False):
        probe = await pristine.exec(_PROBE, timeout=120, user="root", workdir=workdir, env=env, login=login)
        lines = probe.output.rpartition(_MARK + "\n")[2].split("\n")
        if probe.exit_code != 0 or _MARK not in probe.output or len(lines) < 6:
            return unsure
        path, home, data_home, uv_pythons, venv, conda = lines[:6]
        programs |= {name for name in lines[6:] if name}
        entries = path.split(":")
        if any(not e.startswith("/") for e in entries):  # "" or "." is the current directory: anything may be run
            return unsure
        dirs |= {posixpath.normpath(e) for e in entries}
        for h in {home or "/root", "/root"}:
            dirs |= {f"{h}/.local/bin", f"{h}/.cargo/bin"}
            roots.add(f"{h}/.local/share/uv")
        roots |= {posixpath.normpath(r) for r in (f"{data_home}/uv" if data_home else "", uv_pythons, venv, conda) if r}
    roots |= {f"{a}/.venv" for start in (workdir, "/tests") for a in ["", *above(start)]}
    # A directory the diff shows changed with nothing added or changed below it may now be a link elsewhere.
    filled = {a for p, kind in changes.items() if kind != "deleted" for a in above(posixpath.dirname(p))}
    if any(a in changes and a not in filled for d in dirs | roots for a in above(d)):
        return unsure
    return TestsPath(frozenset(dirs), tuple(sorted(roots)), frozenset(programs), sure=True)


def shadowing(view: TestsPath, added: list[str], tests_text: str, test_sh: str) -> list[tuple[str, str]]:
    """(path, line) of added programs where the tests look, named like a program of the image's PATH (`timeout`,
    `id`, `apt-get`) or a word of test.sh (`curl`, installed by its own apt-get after the diff): each must be a
    genuine package file."""
    words = set(re.findall(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*", test_sh))
    found = []
    for p in added:
        name = posixpath.basename(p)
        if view.reaches(p, tests_text) and (name in view.programs or name in words):
            what = "a program of the image's PATH" if name in view.programs else "a word of test.sh"
            found.append((p, f"added {p} (named {name}, {what}, where the tests look for programs)"))
    return found


def _named(directory: str, text: str) -> bool:
    """Whether the tests' files name `directory` or a directory above it below the top level (`/opt/conda` for
    `/opt/conda/bin`: a test sourcing `/opt/conda/etc/profile.d/conda.sh` puts that `bin` on its PATH)."""
    return any(d in text for d in above(directory) if d.count("/") >= 2)
