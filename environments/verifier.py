"""Rewards decided by tests, safe against an agent that edits the tests, their config or the checkout.

The agent's workspace is never trusted. `capture_diff` takes the agent's changes as a diff against
the starting commit; `split_diff` keeps only changes to ordinary source files; `TestVerifier.verify`
builds a pristine checkout (with a callable the task env provides), applies the kept diff there, runs
the tests and reads each named test's outcome. So every test file, `conftest.py`, pytest/tox/setup.cfg/
pyproject configuration, plugin module, `.pth` and `sitecustomize` comes from the original, and
nothing the agent left outside its diff (hooks, caches, processes, /tmp) takes part.

Used by the SWE-smith env; a terminal-tasks env can use it unchanged (any repository + test command).
pytest outcomes are read from pytest's own JUnit XML report (at a path chosen per run), never
from stdout, which the code under test can print to; other runners' output is parsed. What no
in-process harness can stop: source code written to find and rewrite this particular report.
"""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from pydantic import BaseModel, Field

from tools.executor import ToolExecutor

__all__ = [
    "GIT_SAFE",
    "ChangedFile",
    "TestVerifier",
    "TestVerifierConfig",
    "Verdict",
    "capture_diff",
    "parse_junit_statuses",
    "parse_test_statuses",
    "protected_reason",
    "runs_pytest",
    "split_diff",
]

# Git in a directory the agent controlled: no hooks, no fsmonitor, no external diff or textconv drivers.
GIT_SAFE = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c diff.external= -c core.attributesFile=/dev/null"

_TEST_DIRS = {"tests", "test", "testing", "specs", "spec"}
_TEST_CONFIG = {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py"}
_STARTUP = {"sitecustomize.py", "usercustomize.py"}
_CACHES = {"__pycache__", ".pytest_cache", ".tox", ".nox", ".mypy_cache", ".ruff_cache", ".hypothesis"}


def protected_reason(path: str, new_text: str | None = None, *, is_new: bool = False) -> str | None:
    """Why a change to `path` is not carried into the verified checkout (None: it is)."""
    p = PurePosixPath(path)
    name = p.name
    if _CACHES.intersection(p.parts) or name.endswith((".pyc", ".pyo")):
        return "cache or bytecode"
    if ".git" in p.parts or name.startswith(".git"):
        return "git metadata"
    if name in _STARTUP or name.endswith(".pth"):
        return "interpreter startup file"
    if name in _TEST_CONFIG:
        return "test configuration"
    if any(part in _TEST_DIRS for part in p.parts[:-1]):
        return "test file"
    stem = name.rsplit(".", 1)[0].lower()
    if name.lower().startswith("test") or stem.endswith(("test", "_tests")):
        return "test file"
    if new_text is not None and re.search(r"^\s*(def pytest_\w+|pytest_plugins\s*=)", new_text, re.MULTILINE):
        return "pytest plugin code"
    if is_new and len(p.parts) == 1 and name.endswith(".py") or is_new and len(p.parts) == 2 and name == "__init__.py":
        return "new top-level module (could shadow the test runner or a dependency)"
    return None


@dataclass(frozen=True)
class ChangedFile:
    path: str
    kept: bool
    reason: str | None = None  # why it was dropped


_HEADER = re.compile(r"^diff --git a/(.+?) b/(.+)$")


def split_diff(patch: str) -> tuple[str, list[ChangedFile]]:
    """(the diff of files that are carried over, every changed file with its fate)."""
    sections: list[list[str]] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            sections.append([])
        if sections:
            sections[-1].append(line)
    kept: list[str] = []
    files: list[ChangedFile] = []
    for lines in sections:
        m = _HEADER.match(lines[0].rstrip("\n"))
        if not m:
            continue
        paths = {m.group(1), m.group(2)}
        header = "".join(lines[:6])
        is_new = "\nnew file mode" in header
        added = "".join(line[1:] for line in lines if line.startswith("+") and not line.startswith("+++"))
        reason = None
        if "120000" in header or "160000" in header:
            reason = "symlink or submodule"
        for path in sorted(paths):
            reason = reason or protected_reason(path, added, is_new=is_new)
        files.append(ChangedFile(m.group(2), reason is None, reason))
        if reason is None:
            kept.extend(lines)
    return "".join(kept), files


async def capture_diff(executor: ToolExecutor, repo_dir: str, base_commit: str, *, max_bytes: int = 8_000_000) -> str:
    """The agent's changes (tracked and untracked, binary included) against `base_commit`.

    A private index is used so the agent's own index, refs and config do not matter beyond what
    `GIT_SAFE` switches off; a repository the agent broke yields an error (scored as no fix).
    """
    script = f"""set -e
cd {shlex.quote(repo_dir)}
export GIT_INDEX_FILE="$(mktemp)"
{GIT_SAFE} read-tree {shlex.quote(base_commit)}
{GIT_SAFE} add -A -- .
{GIT_SAFE} diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames {shlex.quote(base_commit)}
"""
    result = await executor.exec(script, timeout=120, max_output_bytes=max_bytes)
    if result.exit_code != 0 or result.truncated:
        raise ValueError(f"could not take the agent's diff (exit {result.exit_code}): {result.output[-500:]}")
    return result.output


_STATUS = r"(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)"
_PATTERNS: list[tuple[re.Pattern[str], int, int]] = [
    (re.compile(rf"^(\S+)\s+{_STATUS}\b"), 1, 2),  # pytest --verbose: tests/x.py::t PASSED [ 50%]
    (re.compile(rf"^(?:\[gw\d+\]\s+)?{_STATUS}\s+(\S+)"), 2, 1),  # pytest -rA summary, xdist
    (
        re.compile(
            r"^(\S+) \(([\w.]+)\)(?: \S.*)? \.\.\. (ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)$"
        ),
        2,
        3,
    ),
    (re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+)"), 2, 1),  # go test -v
    (re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)$"), 1, 2),  # cargo test
]
_NORMAL = {
    "ok": "PASSED",
    "PASS": "PASSED",
    "FAIL": "FAILED",
    "SKIP": "SKIPPED",
    "ignored": "SKIPPED",
    "expected failure": "XFAIL",
    "unexpected success": "XPASS",
}


def parse_test_statuses(log: str) -> dict[str, str]:
    """Test name -> PASSED/FAILED/SKIPPED/ERROR/XFAIL/XPASS from pytest, unittest, go test or cargo output."""
    statuses: dict[str, str] = {}
    for line in log.splitlines():
        line = line.rstrip()
        for pattern, name_group, status_group in _PATTERNS:
            m = pattern.match(line)
            if m:
                status = m.group(status_group)
                status = "SKIPPED" if status.startswith("skipped") else _NORMAL.get(status, status)
                statuses[m.group(name_group)] = status
                break
    return statuses


class TestVerifierConfig(BaseModel):
    __test__ = False  # not a pytest class
    timeout_s: float = Field(300.0, gt=0, description="Running the tests")
    max_output_bytes: int = Field(2_000_000, gt=0, description="Test output kept for parsing")


@dataclass
class Verdict:
    score: float
    statuses: dict[str, str] = field(default_factory=dict)  # of the tests that decide the score
    changed_files: list[ChangedFile] = field(default_factory=list)
    output_tail: str = ""
    error: str | None = None

    @property
    def dropped(self) -> list[ChangedFile]:
        return [f for f in self.changed_files if not f.kept]


# Builds the pristine repository at `dest` (relative to the executor's workspace).
PrepareCheckout = Callable[[ToolExecutor, str], Awaitable[None]]


class TestVerifier:
    """Pristine checkout + the agent's source diff + the original tests -> 1.0 only if every named test passes."""

    __test__ = False

    def __init__(self, config: TestVerifierConfig | None = None) -> None:
        self.config = config or TestVerifierConfig()

    async def verify(
        self,
        executor: ToolExecutor,
        *,
        prepare: PrepareCheckout,
        patch: str,
        test_command: str,
        must_pass: Sequence[str] = (),
        setup_command: str | None = None,
    ) -> Verdict:
        """Score `patch` (the agent's diff against the checkout `prepare` builds) by running `test_command`.

        `must_pass`: test names that must each be reported passed (pytest, unittest, go or cargo
        output); empty: the command's exit status decides.
        """
        kept, files = split_diff(patch)
        dest = f".verify-{uuid.uuid4().hex[:8]}"
        await prepare(executor, dest)
        if kept:
            await executor.write_file(f"{dest}.patch", kept.encode())
            applied = await executor.exec(
                f"cd {shlex.quote(dest)} && {GIT_SAFE} apply --whitespace=nowarn ../{dest}.patch",
                timeout=120,
                max_output_bytes=20_000,
            )
            if applied.exit_code != 0:
                return Verdict(
                    0.0, {}, files, applied.output[-2000:], "the agent's diff does not apply to a clean checkout"
                )
        setup = f"{setup_command}\n" if setup_command else ""
        # pytest reports through its own JUnit XML, never through stdout, which code under test can print to.
        junit = bool(must_pass) and runs_pytest(test_command)
        nonce = uuid.uuid4().hex
        if junit:
            run_tests = (
                f'xml="$(mktemp -d)/{nonce}.xml"\n{test_command} --junitxml="$xml" -o junit_family=xunit1 > "$xml.log" 2>&1\n'
                f'rc=$?\ntail -c 20000 "$xml.log"\necho; echo {nonce}; cat "$xml" 2>/dev/null\nexit $rc'
            )
        else:
            run_tests = test_command
        # A clean environment for the test process: nothing the agent set up may steer pytest.
        script = f"""cd {shlex.quote(dest)}
unset PYTEST_ADDOPTS PYTEST_PLUGINS PYTHONPATH PYTHONSTARTUP PYTHONHOME
export PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1
{setup}{run_tests}
"""
        run = await executor.exec(script, timeout=self.config.timeout_s, max_output_bytes=self.config.max_output_bytes)
        log, _, report = run.output.partition(f"\n{nonce}\n")
        statuses = parse_junit_statuses(report) if junit else parse_test_statuses(run.output)
        decisive = {t: statuses.get(t, "MISSING") for t in must_pass}
        if must_pass:
            passed = all(s in ("PASSED", "XFAIL") for s in decisive.values()) and not run.timed_out
        else:  # no named tests (a task's own test script): its exit status decides
            passed = run.exit_code == 0
        error = "timed out" if run.timed_out else ("pytest wrote no report" if junit and not statuses else None)
        return Verdict(1.0 if passed else 0.0, decisive, files, log[-3000:], error)


def runs_pytest(command: str) -> bool:
    """Whether a shell command runs pytest (a word `pytest`, `-m pytest`, `.../bin/pytest`), not a path merely
    naming it (an interpreter under /tmp/pytest-of-root/...)."""
    return re.search(r"(?:^|[\s;&|/(\"'`=])pytest(?=[\s;&|)\"'`]|$)", command) is not None


def parse_junit_statuses(xml: str) -> dict[str, str]:
    """pytest node id -> status from a JUnit XML report (xunit1: each testcase names its file)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(xml.strip())
    except ET.ParseError:
        return {}
    statuses: dict[str, str] = {}
    for case in root.iter("testcase"):
        file, classname, name = case.get("file"), case.get("classname", ""), case.get("name", "")
        if not file or not name:
            continue
        module = file.removesuffix(".py").replace("/", ".")
        classes = classname[len(module) :].strip(".") if classname.startswith(module) else ""
        node = "::".join([file, *([c for c in classes.split(".") if c]), name])
        kinds = {child.tag for child in case}
        skipped = case.find("skipped")
        if "failure" in kinds or "error" in kinds:
            status = "FAILED" if "failure" in kinds else "ERROR"
        elif skipped is not None:
            status = "XFAIL" if skipped.get("type") == "pytest.xfail" else "SKIPPED"
        else:
            status = "PASSED"
        statuses[node] = status
    return statuses
