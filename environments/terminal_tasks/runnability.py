"""Can this machine's local sandbox reproduce a task? Its scripts read as a shell would, checked against this machine.

A build or test script is cut into logical lines the way the shell reads them (backslash
continuations joined, comments dropped, heredoc bodies kept whole) and each command is
classified: package-index chores (dropped), installs (dropped when this machine already
has the package — `dpkg-query`, the sandbox interpreter's distributions, `PATH` — a problem
otherwise), downloads (`git clone`, curl/wget of a non-loopback URL), user accounts and
ownership (a problem when the task's tests look at owners), and writes outside the
directories the sandbox maps onto its workspace. Every problem is kept, not just the first.

A problem in `tests/test.sh` that only fetches the test tools (apt `curl`, the uv installer,
`uvx`/`uv`/pip pulling pytest) is a *bootstrap* problem: with
`--env.bootstrap_tests_with_sandbox_pytest` the script runs with the sandbox's own pytest
instead (`sandbox_pytest_script`).
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import PurePosixPath

from pydantic import BaseModel

__all__ = ["Machine", "Problem", "scan_script", "logical_lines", "sandbox_pytest_script", "OWNERSHIP_CHECK"]

_ENV_PREFIX = re.compile(r"^(?:[A-Za-z_]\w*=(?:'[^']*'|\"[^\"]*\"|\S*)\s+)+")
_SUDO = re.compile(r"^(?:sudo(?:\s+-\S+)*\s+|env\s+(?:[A-Za-z_]\w*=\S*\s+)*)")
_APT = {"apt-get", "apt", "aptitude"}
_OTHER_PM = {"apk": "add", "yum": "install", "dnf": "install", "zypper": "install", "conda": "install"}
_INDEX_CHORES = re.compile(
    r"^(apt-get|apt|apk|yum|dnf)\s+(-\S+\s+)*(update|upgrade|clean|autoremove|autoclean)\b|^rm\s+-rf?\s+/var/lib/apt/lists"
)
_USERS = re.compile(r"^(useradd|adduser|groupadd|addgroup|usermod|chown|chgrp|passwd|chpasswd)\b")
_URL = re.compile(r"\b(?:https?|ftp)://([^/\s:'\"]+)")
_LOOPBACK = {"localhost", "127.0.0.1", "0.0.0.0", "[::1]", "::1"}
# Test-tool packages a test.sh pulls for itself; the sandbox's interpreter has pytest.
_TEST_TOOLS = re.compile(r"^(pytest(-[\w-]+)?|pluggy|iniconfig|packaging)$")
_SPLIT = re.compile(r"\s*(?:&&|\|\||;|\|)\s*(?=(?:[^'\"]|'[^']*'|\"[^\"]*\")*$)")
_REDIRECT = re.compile(r"(?<![<&\d])(?:\d?>>?|&>)\s*([^\s;&|]+)")
_WRITERS = {"mkdir", "touch", "cp", "mv", "ln", "install", "tee", "chmod", "rm", "rmdir", "dd", "tar", "unzip", "sed"}
# Tests that look at owners or accounts: a dropped useradd/chown would change their verdict.
OWNERSHIP_CHECK = re.compile(
    r"st_uid|st_gid|getpwnam|getpwuid|getgrnam|getgrgid|\.owner\(\)|\.group\(\)|stat\s+-c\s*['\"]?%[UGug]|\bid\s+-[ugn]|/etc/passwd|/etc/group"
)
# Writes that change nothing a task leaves behind: the command's private /tmp, and the character devices and
# descriptors every sandbox has (bubblewrap's --dev: null, zero, full, random, urandom, tty; the fd links).
_ALWAYS_WRITABLE = (
    "/tmp",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/stdin",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/fd",
    "/proc/self/fd",
)


class Problem(BaseModel, frozen=True):
    """Why the local sandbox cannot reproduce part of a task; `bootstrap`: only its test tools are fetched."""

    text: str
    bootstrap: bool = False


@dataclass
class Machine:
    """What this machine really has: Debian packages, the sandbox interpreter's distributions, commands on PATH."""

    _debs: frozenset[str] | None = field(default=None, repr=False)

    @cached_property
    def debs(self) -> frozenset[str]:
        if self._debs is not None:
            return self._debs
        if shutil.which("dpkg-query") is None:
            return frozenset()
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package}\n"], capture_output=True, text=True, check=False
        ).stdout
        return frozenset(line.split()[1].split(":")[0] for line in out.splitlines() if line.startswith("ii "))

    def has_deb(self, name: str) -> bool:
        return name in self.debs or (name.startswith("python3-") and self.has_dist(name.removeprefix("python3-")))

    @staticmethod
    def has_dist(name: str) -> bool:
        try:
            importlib.metadata.distribution(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            return False

    @staticmethod
    def has_command(name: str) -> bool:
        return shutil.which(name) is not None


def logical_lines(script: str) -> list[str]:
    """The script's commands as the shell reads them: continuations joined, comments dropped, heredocs whole."""
    out: list[str] = []
    buf, heredoc = "", None
    for raw in script.splitlines():
        if heredoc is not None:
            buf += "\n" + raw
            if raw.strip() == heredoc:
                out.append(buf)
                buf, heredoc = "", None
            continue
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        # A heredoc (not a here-string `<<<` nor an arithmetic shift `$((1<<2))`): its body is data.
        m = re.search(r"(?<!<)<<-?\s*['\"]?([A-Za-z_]\w*)['\"]?", buf)
        if m:
            heredoc = m.group(1)
            continue
        out.append(buf.strip())
        buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment, comments=True)
    except ValueError:
        return segment.split()


def _command(segment: str) -> str:
    """The segment without env assignments (DEBIAN_FRONTEND=... ) and sudo in front."""
    seg = segment.strip().lstrip("({").strip()
    for _ in range(3):
        seg = _SUDO.sub("", _ENV_PREFIX.sub("", seg))
    return seg


def _installs(words: list[str]) -> tuple[str, list[str]] | None:
    """(manager, packages) when the command installs something."""
    if not words:
        return None
    head = PurePosixPath(words[0]).name
    rest = words[1:]
    if head in ("python", "python3") and rest[:2] == ["-m", "pip"]:
        head, rest = "pip", rest[2:]
    if head == "uv" and rest[:1] == ["pip"]:
        head, rest = "pip", rest[1:]
    if head == "uv" and rest[:1] in (["add"], ["tool"]):
        return "uv", [w for w in rest[1:] if not w.startswith("-") and w != "install"]
    if head == "uvx" or (head == "uv" and rest[:1] == ["run"]):
        # uvx/uv run fetch what they run: the tool and every -w/--with package.
        pkgs, i = [], 0
        while i < len(rest):
            w = rest[i]
            if w in ("-w", "--with", "--from"):
                pkgs.append(rest[i + 1] if i + 1 < len(rest) else "")
                i += 2
                continue
            if w in ("-p", "--python"):
                i += 2
                continue
            if not w.startswith("-"):
                pkgs.append(w)
                break
            i += 1
        return "uvx", pkgs
    verb = {"pip": "install", "pip3": "install", "npm": "install", "gem": "install", "cargo": "install"} | _OTHER_PM
    if head in _APT | set(verb):
        want = "install" if head in _APT else verb[head]
        plain = [w for w in rest if not w.startswith("-")]
        if plain[:1] == [want] or (head == "npm" and plain[:1] in (["i"], ["ci"])):
            pkgs = [w for w in rest[rest.index(plain[0]) + 1 :] if not w.startswith("-")]
            if head in ("pip", "pip3") and any(w in ("-r", "--requirement", "-e", ".") for w in rest):
                pkgs.append(" ".join(rest))  # requirements files and local projects: not checkable here
            return head, pkgs
    return None


def _base(pkg: str) -> str:
    return re.split(r"[=<>~!\[;@ ]", pkg.strip(), maxsplit=1)[0]


def _missing(manager: str, pkgs: list[str], machine: Machine) -> list[str]:
    names = [_base(p) for p in pkgs if p]
    if manager in _APT:
        return [n for n in names if not machine.has_deb(n)]
    if manager in ("pip", "pip3", "uv", "uvx"):
        return [n for n in names if not machine.has_dist(n)]
    return names  # apk/yum/npm/conda...: nothing of theirs is checked here


def _downloads(words: list[str], segment: str) -> str | None:
    if not words:
        return None
    head = PurePosixPath(words[0]).name
    if head == "git" and "clone" in words:
        src = [w for w in words[words.index("clone") + 1 :] if not w.startswith("-")]
        if src and not (src[0].startswith(("/", "./", "../", "file://")) or _loopback_url(src[0])):
            return f"git clone {src[0]}"
    if head in ("curl", "wget", "aria2c") or (head == "git" and words[1:2] in (["fetch"], ["pull"])):
        urls = [w for w in words if _URL.search(w)]
        remote = [u for u in urls if not _loopback_url(u)]
        if remote or (head == "git" and not urls):
            return f"{head} {remote[0] if remote else ' '.join(words[1:3])}"
    return None


def _loopback_url(url: str) -> bool:
    m = _URL.search(url)
    return bool(m and m.group(1).lower() in _LOOPBACK)


def _written_paths(words: list[str], segment: str) -> list[str]:
    paths = [m.group(1) for m in _REDIRECT.finditer(segment)]
    if words and PurePosixPath(words[0]).name in _WRITERS:
        args = [w for w in words[1:] if not w.startswith("-")]
        if words[0] in ("cp", "mv", "ln", "install") and args:
            args = args[-1:]
        if words[0] == "dd":
            args = [w.removeprefix("of=") for w in words[1:] if w.startswith("of=")]
        if words[0] == "sed":
            args = _sed_files(words)
        if words[0] == "tar":
            args = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-C", "--directory")]
        paths += args
    return [p.strip("'\"") for p in paths if p.strip("'\"").startswith("/")]


def _sed_files(words: list[str]) -> list[str]:
    """The files `sed -i` edits: its operands after the script (the first operand, unless -e/-f gave it)."""
    if not any(w == "-i" or w.startswith(("-i", "--in-place")) for w in words[1:]):
        return []
    operands, scripted, skip = [], False, False
    for w in words[1:]:
        if skip:
            skip = False
        elif w in ("-e", "-f", "--expression", "--file"):
            scripted, skip = True, True
        elif w.startswith(("--expression=", "--file=")):
            scripted = True
        elif not w.startswith("-"):
            operands.append(w)
    return operands if scripted else operands[1:]


def _outside(path: str, roots: tuple[str, ...]) -> bool:
    p = PurePosixPath(path)
    return not any(p == PurePosixPath(r) or p.is_relative_to(r) for r in roots + _ALWAYS_WRITABLE)


def scan_script(
    script: str,
    *,
    where: str,
    machine: Machine | None,
    roots: tuple[str, ...],
    ownership_checked: bool,
    test_script: bool = False,
) -> tuple[list[str], list[Problem]]:
    """(the script's commands as the workspace replays them, every problem found), for the script at `where`.

    `roots`: the task's directories the sandbox maps into its workspace (writes there are fine).
    `test_script`: fetching the test tools is a bootstrap problem (see the module docstring).
    `machine` None: only the replayed commands are wanted (installs are not checked).
    """
    kept: list[str] = []
    problems: list[Problem] = []

    def problem(text: str, bootstrap: bool = False) -> None:
        p = Problem(text=f"{where}: {text}" if where else text, bootstrap=bootstrap and test_script)
        if p not in problems:
            problems.append(p)

    for line in logical_lines(script):
        if "\n" in line:  # a heredoc: its body is data, only the first line is a command
            head = line.split("\n", 1)[0]
            for path in _written_paths(_words(head.split("<<")[0]), head.split("<<")[0]):
                if _outside(path, roots):
                    problem(f"writes outside the workspace ({path})")
            kept.append(line)
            continue
        kept_segments: list[str] = []
        for chunk in re.split(r"\s*(?:&&|;)\s*(?=(?:[^'\"]|'[^']*'|\"[^\"]*\")*$)", line):
            drop = False
            for segment in _SPLIT.split(chunk):
                cmd = _command(segment)
                words = _words(cmd)
                if not cmd or _INDEX_CHORES.match(cmd):
                    if cmd and test_script:  # test.sh runs it for real at verification time
                        problem(f"updates package indexes ({cmd[:40]})", bootstrap=True)
                    drop = drop or bool(cmd)
                    continue
                if words[:1] in (["source"], ["."]) and ".local/bin/env" in cmd:
                    problem("sources the uv installer's environment", bootstrap=True)
                    drop = True
                    continue
                if _USERS.match(cmd):
                    if ownership_checked:
                        problem(f"sets up users/owners the tests check ({cmd[:60]})")
                    drop = True  # otherwise harmless: the workspace has one user
                    continue
                install = _installs(words)
                if install:
                    manager, pkgs = install
                    missing = _missing(manager, pkgs, machine) if machine is not None else []
                    # Test tools the sandbox's pytest replaces; anything else must already be on this machine.
                    tools_only = all(_TEST_TOOLS.match(m) or m == "curl" for m in missing)
                    if missing:
                        problem(f"installs {' '.join(missing)} (not on this machine)", bootstrap=tools_only)
                    elif test_script or manager == "uvx":
                        # A test script runs its installs for real (uvx always fetches into its own cache).
                        problem(f"fetches its test tools ({cmd[:70]})", bootstrap=True)
                    drop = True
                    continue
                fetched = _downloads(words, segment)
                if fetched:
                    uv_installer = "astral.sh/uv" in segment
                    problem(f"downloads ({fetched[:80]})", bootstrap=uv_installer)
                    drop = True
                    continue
                for path in _written_paths(words, segment):
                    if _outside(path, roots):
                        problem(f"writes outside the workspace ({path})")
            if not drop:
                kept_segments.append(chunk)
        if kept_segments:
            kept.append(" && ".join(kept_segments))
    return kept, problems


_UV_OPTIONS_WITH_VALUE = {"-p", "--python", "-w", "--with", "--from", "--with-requirements", "--index-url"}


def _uvx_pytest_args(words: list[str]) -> list[str] | None:
    """The pytest arguments of `uvx [options] pytest ARGS` / `uv run [options] pytest ARGS`, else None."""
    if words[:1] == ["uvx"]:
        rest = words[1:]
    elif words[:2] == ["uv", "run"]:
        rest = words[2:]
    else:
        return None
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        i += 2 if rest[i] in _UV_OPTIONS_WITH_VALUE else 1
    if i < len(rest) and rest[i] == "pytest":
        return rest[i + 1 :]
    return None


def sandbox_pytest_script(script: str, machine: Machine) -> str:
    """test.sh with its test-tool bootstrap removed and `uvx ... pytest ARGS` run as the sandbox's `python3 -m pytest`."""
    out = []
    for line in logical_lines(script):
        if "\n" in line:
            out.append(line)
            continue
        args = _uvx_pytest_args(_words(line))
        if args is not None:
            if not machine.has_dist("pytest-json-ctrf"):
                args = [a for i, a in enumerate(args) if a != "--ctrf" and (i == 0 or args[i - 1] != "--ctrf")]
            out.append("python3 -m pytest " + " ".join(shlex.quote(a) for a in args))
            continue
        kept, problems = scan_script(
            line, where="", machine=machine, roots=("/",), ownership_checked=False, test_script=True
        )
        if problems and all(p.bootstrap for p in problems):
            out.extend(kept)
        else:
            out.append(line)
    return "\n".join(out) + "\n"
