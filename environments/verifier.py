"""Rewards decided by tests, safe against an agent that edits the tests, their config or the checkout.

The agent's workspace is never trusted. `capture_diff` takes the agent's changes as a diff against
the starting commit; `split_diff` keeps only changes to ordinary source files; `TestVerifier.verify`
builds a pristine checkout (with a callable the task env provides), applies the kept diff there, runs
the tests and reads each named test's outcome. So every test file, `conftest.py`, pytest/tox/setup.cfg/
pyproject configuration, plugin module, `.pth` and `sitecustomize` comes from the original, and
nothing the agent left outside its diff (hooks, caches, processes, /tmp) takes part.

Used by the SWE-smith env; a terminal-tasks env can use it unchanged (any repository + test command).
The code under test runs inside the test runner, so the verdict never comes from what that process
prints or leaves behind: pytest and unittest outcomes come from `verifier_probe`, loaded before the
code under test and writing each outcome as it happens to a pipe the verifier holds (HMAC-chained);
pytest's JUnit report is only cross-checked. Other runners' output is printed by the code under test,
so named tests run by them are not scored. The command's PYTHONPATH is handed to the probe, which puts it
after the standard library, so nothing the agent wrote runs in the test process before the probe. The kept
diff is screened for runner tampering (`screen_diff`), its Python files whole for values that lie to the
tests' comparisons (`screen_semantics`), and `verifier_watch`, shipped with the probe, asks the code under
test's classes and watches the tests' files during the run; a flagged rollout scores 0 with its reasons.
docs/security.md has the residual risk.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import shlex
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from environments.verifier_semantics import screen_semantics
from environments.verifier_screen import SHADOW, ChangedFile, protected_reason, screen_diff, split_diff
from tools.executor import ToolExecutor

__all__ = [
    "GIT_SAFE",
    "ChangedFile",
    "TestVerifier",
    "TestRun",
    "TestVerifierConfig",
    "Verdict",
    "capture_diff",
    "parse_junit_statuses",
    "parse_test_statuses",
    "protected_reason",
    "read_probe",
    "runs_pytest",
    "screen_diff",
    "split_diff",
]

# Git in a directory the agent controlled: no system or global config (HOME may be the agent's workspace,
# whose ~/.gitconfig could name a template, smudge filter or hook), no hooks, no fsmonitor, no external
# diff or textconv drivers.
GIT_SAFE = (
    "env GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1 HOME=/nonexistent "
    "XDG_CONFIG_HOME=/nonexistent git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c diff.external= "
    "-c core.attributesFile=/dev/null"
)


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
    flags: list[str] = field(default_factory=list)  # runner tampering seen in the diff or the run: scored 0

    @property
    def dropped(self) -> list[ChangedFile]:
        return [f for f in self.changed_files if not f.kept]


@dataclass(frozen=True)
class TestRun:
    """A test command's run as the verifier makes it (`TestVerifier.run_tests`)."""

    __test__ = False  # not a pytest class
    exit_code: int | None
    timed_out: bool
    output: str
    log: str  # probed: the probe's records, then the tail of the run's own output; else the whole output
    report: str  # probed pytest: its JUnit XML report ("" otherwise)


# Builds the pristine repository at `dest` (relative to the executor's workspace).
PrepareCheckout = Callable[[ToolExecutor, str], Awaitable[None]]

_PROBE_SOURCE = Path(__file__).with_name("verifier_probe.py")
_WATCH_SOURCE = Path(__file__).with_name("verifier_watch.py")  # loaded by the probe as <probe>_watch
_PROBE_PREFIX = "@hermes-verdict "
_PROBE_FD = 3
_PROBE_PATH_VAR = "HERMES_PROBE_PYTHONPATH"  # the probe's own name for it (verifier_probe._PATH_VAR)
_UNITTEST = re.compile(r"(\s-m\s+)unittest(?![\w.])")
_INLINE_PYTHONPATH = re.compile(r"(^|[\s;&|(])PYTHONPATH=")


def read_probe(output: str) -> tuple[dict[str, str], list[str], bool]:
    """(test -> status, tampering reported or seen, whether the run reported its end) from the probe's records.

    Only the HMAC chain started by the first record counts; any other record line (the code under test
    can write into the same pipe, or print such lines to its log) is itself a flag. A test's status is
    PASSED, FAILED, ERROR (setup/teardown), SKIPPED, XPASS, XFAIL (declared by the tests) or
    XFAIL_UNDECLARED (raised by the code under test).
    """
    key: bytes | None = None
    mac = b""
    flags: list[str] = []
    phases: dict[str, dict[str, dict]] = {}
    ended = False
    forged = 0
    for line in output.splitlines():
        if not line.startswith(_PROBE_PREFIX):
            continue
        payload, _, tag = line[len(_PROBE_PREFIX) :].rpartition("\t")
        try:
            record = json.loads(payload)
            if key is None:
                if record.get("k") != "start" or tag != hashlib.sha256(payload.encode()).digest()[:16].hex():
                    raise ValueError("not the start record")
                key, mac = bytes.fromhex(record["key"]), bytes.fromhex(tag)
                continue
            expected = hmac.new(key, mac + payload.encode(), hashlib.sha256).digest()[:16]
            if not hmac.compare_digest(expected.hex(), tag):
                raise ValueError("bad mac")
        except (ValueError, KeyError, TypeError):
            forged += 1
            continue
        mac = expected
        kind = record.get("k")
        if kind == "tamper":
            flags.append(str(record.get("what")))
        elif kind == "end":
            ended = True
        elif kind == "report":
            node, when = str(record["node"]), str(record["when"])
            if when == "subtest":  # pytest >= 9, one per subtest not passed: a failed one fails the test
                if record["outcome"] == "failed":
                    phases.setdefault(node, {})[when] = record
                continue
            if when in phases.setdefault(node, {}):
                flags.append(f"{node} was reported twice for its {when} phase")
            phases[node][when] = record
    if forged:
        flags.append(f"{forged} forged or out-of-chain verdict record(s) in the test output")
    return {node: _status(p) for node, p in phases.items()}, flags, ended


def _status(phases: dict[str, dict]) -> str:
    for when in ("setup", "subtest", "call", "teardown"):
        r = phases.get(when)
        if r and r["outcome"] == "failed":
            return "FAILED" if when in ("subtest", "call") else "ERROR"
    call = phases.get("call") or phases.get("setup")
    if call is None:
        return "MISSING"
    if call["xfail"]:
        if call["outcome"] == "passed":
            return "XPASS"
        return "XFAIL" if call.get("declared", True) else "XFAIL_UNDECLARED"
    return {"passed": "PASSED", "skipped": "SKIPPED"}.get(call["outcome"], "FAILED")


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
        dest: str | None = None,
    ) -> Verdict:
        """Score `patch` (the agent's diff against the checkout `prepare` builds) by running `test_command`.

        `dest`: where `prepare` builds the checkout, relative to the workspace (default: a new directory);
        "." is the workspace itself, for images whose environment expects the repository there (a fresh slot).

        `must_pass`: test names that must each really pass (PASSED, or an expected failure the tests
        declare), as pytest or unittest report them to the probe; empty: the command's exit status decides.
        Named tests under any other runner score 0 with an error: its output is the code under test's to print.
        """
        kept, files = split_diff(patch)
        flags = screen_diff(kept) + [
            f"{f.path}: {f.reason} (dropped)"
            for f in files
            if f.reason and (f.reason == "pytest plugin code" or f.reason.startswith(SHADOW))
        ]
        dest = dest or f".verify-{uuid.uuid4().hex[:8]}"
        await prepare(executor, dest)
        if kept:
            # Beside the checkout, or (at the workspace root) in it until applied.
            patch_file = ".hermes-verify.patch" if dest == "." else f"{dest}.patch"
            await executor.write_file(patch_file, kept.encode())
            quoted = shlex.quote(patch_file)
            applied = await executor.exec(
                f'cd {shlex.quote(dest)} && {GIT_SAFE} apply --whitespace=nowarn "$OLDPWD"/{quoted}; '
                f'rc=$?; rm -f "$OLDPWD"/{quoted}; exit $rc',
                timeout=120,
                max_output_bytes=20_000,
            )
            if applied.exit_code != 0:
                return Verdict(
                    0.0, {}, files, applied.output[-2000:], "the agent's diff does not apply to a clean checkout", flags
                )
            flags += await _screen_kept_python(executor, dest, [f.path for f in files if f.kept])
        runner = _runner(test_command)
        probed = bool(must_pass) and runner is not None
        changed = [f.path for f in files if f.kept]
        run = await self.run_tests(
            executor, dest=dest, test_command=test_command, changed=changed, probe=probed, setup_command=setup_command
        )
        if not must_pass:  # no named tests (a task's own test script): its exit status decides
            passed = run.exit_code == 0 and not flags
            return Verdict(
                1.0 if passed else 0.0, {}, files, run.output[-3000:], "timed out" if run.timed_out else None, flags
            )
        if not probed:
            statuses = parse_test_statuses(run.output)
            decisive = {t: statuses.get(t, "MISSING") for t in must_pass}
            error = "named tests are verified only under pytest or unittest: this runner's output is printed by the code under test"
            return Verdict(0.0, decisive, files, run.output[-3000:], error, flags)
        statuses, run_flags, ended = read_probe(run.log)
        flags += run_flags
        decisive = {t: statuses.get(t, "MISSING") for t in must_pass}
        if runner == "pytest":
            junit = parse_junit_statuses(run.report)
            for test, status in decisive.items():
                if junit.get(test) in ("PASSED", "XPASS") and status not in ("PASSED", "XPASS"):
                    flags.append(
                        f"the JUnit report says {test} passed, the probe saw {status}: the report was rewritten"
                    )
        passed = all(s in ("PASSED", "XFAIL") for s in decisive.values()) and ended and not run.timed_out and not flags
        ending = None if ended else _no_end(run)
        return Verdict(
            1.0 if passed else 0.0, decisive, files, run.log[-3000:], "timed out" if run.timed_out else ending, flags
        )

    async def run_tests(
        self,
        executor: ToolExecutor,
        *,
        dest: str,
        test_command: str,
        changed: Sequence[str] = (),
        probe: bool = True,
        setup_command: str | None = None,
    ) -> TestRun:
        """Run `test_command` in the checkout at `dest` as `verify` does, with the probe loaded when `probe` and
        the command runs pytest or unittest (`changed`: the files the agent changed, which the probe distrusts).

        The probe and its config live in this command's private temp dir (the sandbox gives each command its own
        /tmp), so nothing the agent left running in the slot can reach them before they load.
        """
        runner = _runner(test_command) if probe else None
        nonce = uuid.uuid4().hex
        module = f"hermes_probe_{nonce[:12]}"
        script = [
            f"cd {shlex.quote(dest)}",
            "unset PYTEST_ADDOPTS PYTEST_PLUGINS PYTHONPATH PYTHONSTARTUP PYTHONHOME",
            "export PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1",
            'run="$(mktemp -d)"',
            'mkdir "$run/home" && export HOME="$run/home"',  # not the agent's workspace
        ]
        if runner:
            config = json.dumps({"fd": _PROBE_FD, "changed": sorted(changed)})
            script += [
                f"cat > \"$run/{module}.py\" <<'HERMES_PROBE_{nonce}'\n{_PROBE_SOURCE.read_text()}HERMES_PROBE_{nonce}",
                f"cat > \"$run/{module}_watch.py\" <<'HERMES_PROBE_{nonce}'\n{_WATCH_SOURCE.read_text()}HERMES_PROBE_{nonce}",
                f"printf '%s' {shlex.quote(config)} > \"$run/{module}.json\"",
            ]
        if setup_command:
            script.append(setup_command)
        if not runner:
            script.append(test_command)
        else:
            # The command's PYTHONPATH (a prepared venv's source root, assigned in the command or exported by the
            # setup) goes to the probe, which puts it on sys.path after the standard library: on PYTHONPATH it
            # would come first, and a module there named like one of the stdlib's would run before the probe.
            command = _INLINE_PYTHONPATH.sub(lambda m: f"{m.group(1)}{_PROBE_PATH_VAR}=", test_command)
            if runner == "pytest":
                command = f'{command} -p {module} --junitxml="$run/{nonce}.xml" -o junit_family=xunit1'
            else:
                command = _UNITTEST.sub(lambda m: f"{m.group(1)}{module} unittest", command)
            script += [
                f'export {_PROBE_PATH_VAR}="${{PYTHONPATH-}}" PYTHONPATH="$run"',
                # fd {_PROBE_FD}: the probe's pipe to us; everything else the run prints goes to a log
                f'exec {_PROBE_FD}>&1 >"$run/log" 2>&1',
                command,
                "rc=$?",
                f"exec >&{_PROBE_FD} 2>&1 {_PROBE_FD}>&-",
                f'tail -c 20000 "$run/log"; echo; echo {nonce}; head -c 1000000 "$run/{nonce}.xml" 2>/dev/null',
                "exit $rc",
            ]
        run = await executor.exec(
            "\n".join(script) + "\n", timeout=self.config.timeout_s, max_output_bytes=self.config.max_output_bytes
        )
        log, _, report = run.output.partition(f"\n{nonce}\n") if runner else (run.output, "", "")
        return TestRun(run.exit_code, run.timed_out, run.output, log, report)


# A runner's own words when it stops before or outside the tests: argparse's usage error (pytest's unknown
# `--cov` from a repository's addopts without pytest-cov), a conftest's import error, a missing runner.
_RUNNER_ERROR = re.compile(
    r"^(?:E\s+)?(?:\S.*?: error: .+|ERROR: (?!usage:).+|\w+(?:Error|Exception): .+|.*No module named .+)$"
)


def _no_end(run: TestRun) -> str:
    """One line for a test process that never reported its end, with the runner's own error where it printed one."""
    lines = [x.strip() for x in run.log.splitlines() if x.strip() and not x.startswith(_PROBE_PREFIX)]
    said = next((x for x in lines if _RUNNER_ERROR.match(x)), lines[-1] if lines else "nothing")
    return f"the test process ended without reporting its end (exit {run.exit_code}): {said[:300]}"


async def _screen_kept_python(executor: ToolExecutor, dest: str, paths: Sequence[str]) -> list[str]:
    """`screen_semantics` over the kept Python files as the patched checkout has them (whole, not the diff's lines)."""
    flags: list[str] = []
    for path in paths:
        if not path.endswith(".py"):
            continue
        where = shlex.quote(path if dest == "." else f"{dest}/{path}")
        shown = await executor.exec(f"cat -- {where}", timeout=60, max_output_bytes=4_000_000)
        if shown.exit_code == 0 and not shown.truncated:  # a deleted file has nothing to show
            flags += screen_semantics(path, shown.output)
    return flags


def _runner(test_command: str) -> str | None:
    """The runner the probe can be loaded into that `test_command` runs: "pytest", "unittest" or None."""
    if runs_pytest(test_command):
        return "pytest"
    return "unittest" if _UNITTEST.search(test_command) else None


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
