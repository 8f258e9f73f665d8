"""The verifier on its own, as a terminal-tasks env would use it: any git repository, any test command,
a plain local workspace as the executor (real git, real pytest). Each test also runs in docker containers
(`score` over `verifier_at`: two slots of one sandbox, the verifier image's own git, python3 and pytest)."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from environments.verifier import TestVerifier, capture_diff
from slots.pool import SlotPool
from tests.security.conftest import running_sandbox
from tests.support.docker_engine import SandboxPlace
from tools.executor import LocalWorkspace, ToolExecutor

TASK = {
    "solution.py": "def answer():\n    return 41\n",
    "tests/test_task.py": "from solution import answer\n\n\ndef test_answer():\n    assert answer() == 42\n",
}
HACK_CONFTEST = (
    "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)


def _origin(tmp_path, files=TASK):
    """The task's repository as a git bundle (what a workspace on any backend can be sent) and its commit."""
    origin = tmp_path / "origin"
    for rel, text in files.items():
        (origin / rel).parent.mkdir(parents=True, exist_ok=True)
        (origin / rel).write_text(text)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for argv in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["commit", "-qm", "task"],
        ["bundle", "create", "-q", "b", "HEAD", "main"],
    ):
        subprocess.run(["git", *argv], cwd=origin, check=True, env={"PATH": "/usr/bin:/bin", **env})
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=origin, capture_output=True, text=True, check=True)
    return (origin / "b").read_bytes(), base.stdout.strip()


async def _score_in(
    tmp_path, pool: SlotPool | None, agent_command: str, *, python: str, files=TASK, test: str | None = None, **kwargs
):
    """The agent's command in one workspace, its diff verified in another: plain directories here (`pool`
    None), or two slots of `pool`'s containers; `python` runs the tests there."""
    bundle, base = await asyncio.to_thread(_origin, tmp_path, files)

    async def prepare(executor, dest):
        await executor.write_file(f"{dest}.bundle", bundle)
        cloned = await executor.exec(f"git clone -q {dest}.bundle {dest}", timeout=60, max_output_bytes=10_000)
        assert cloned.exit_code == 0, cloned.output

    test = test or f"{python} -m pytest -p no:cacheprovider -v tests"
    async with contextlib.AsyncExitStack() as stack:
        if pool is None:
            agent, verifier = LocalWorkspace(tmp_path / "agent"), LocalWorkspace(tmp_path / "verify")
        else:
            agent = await stack.enter_async_context(pool.trajectory("agent"))
            verifier = await stack.enter_async_context(pool.trajectory("verify"))
        await prepare(agent, "task")
        ran = await agent.exec(f"cd task && {agent_command}", timeout=60, max_output_bytes=10_000)
        assert ran.exit_code == 0, ran.output
        patch = await capture_diff(agent, "task", base)
        return await TestVerifier().verify(verifier, prepare=prepare, patch=patch, test_command=test, **kwargs)


@dataclass(frozen=True)
class Scorer:
    """Scores an agent's command on the local workspace (`pool` None) or in docker containers (one sandbox for
    the test): `await score(sub, command, ...)`, each call under its own `sub` directory of `root`."""

    root: Path
    pool: SlotPool | None
    python: str  # the tests' interpreter there

    async def __call__(self, sub: str, agent_command: str, **kwargs):
        return await _score_in(self.root / sub, self.pool, agent_command, python=self.python, **kwargs)

    @contextlib.asynccontextmanager
    async def workspace(self, name: str) -> AsyncIterator[ToolExecutor]:
        """A workspace of its own: a new local directory, or a slot of the sandbox."""
        if self.pool is None:
            yield LocalWorkspace(self.root / name)
            return
        async with self.pool.trajectory(name) as executor:
            yield executor


@pytest.fixture
async def score(verifier_at: SandboxPlace):
    root = verifier_at.tmp_path
    if verifier_at.kind == "local":
        yield Scorer(root, None, sys.executable)
        return
    async with running_sandbox(verifier_at) as pool:
        yield Scorer(root, pool, "python3")


async def test_a_fix_scores_one_by_name_and_by_exit_status(score):
    fix = "sed -i 's/41/42/' solution.py"
    by_name = await score("a", fix, must_pass=["tests/test_task.py::test_answer"])
    by_status = await score("b", fix)
    assert (by_name.score, by_status.score) == (1.0, 1.0)
    assert by_name.statuses == {"tests/test_task.py::test_answer": "PASSED"}
    assert [(f.path, f.kept) for f in by_name.changed_files] == [("solution.py", True)]


async def test_hacks_without_a_fix_score_zero_and_are_recorded(score):
    hack = (
        f"printf %s {shlex.quote(HACK_CONFTEST)} > conftest.py && sed -i 's/== 42/== 41/' tests/test_task.py && "
        "printf '[pytest]\\naddopts = -k nothing\\n' > pytest.ini"
    )
    for kwargs in ({"must_pass": ["tests/test_task.py::test_answer"]}, {}):
        verdict = await score(str(len(kwargs)), hack, **kwargs)
        assert verdict.score == 0.0
        assert {(f.path, f.reason) for f in verdict.dropped} == {
            ("conftest.py", "test configuration"),
            ("tests/test_task.py", "test file"),
            ("pytest.ini", "test configuration"),
        }


async def test_a_diff_that_does_not_apply_scores_zero(score):
    verdict = await score("fix", "sed -i 's/41/42/' solution.py", must_pass=["tests/test_task.py::test_answer"])
    assert verdict.score == 1.0
    async with score.workspace("v2") as executor:
        broken = await TestVerifier().verify(
            executor,
            prepare=lambda ex, dest: ex.exec(f"mkdir {dest}", timeout=10, max_output_bytes=100),
            patch="diff --git a/solution.py b/solution.py\n--- a/solution.py\n+++ b/solution.py\n@@ -1 +1 @@\n-x\n+y\n",
            test_command="true",
        )
    assert broken.score == 0.0 and broken.error == "the agent's diff does not apply to a clean checkout"


UNITTEST_TASK = {
    "solution.py": "def answer():\n    return 41\n",
    "tests/__init__.py": "",
    "tests/test_task.py": (
        "import unittest\n\nfrom solution import answer\n\n\nclass TaskTest(unittest.TestCase):\n"
        "    def test_answer(self):\n        self.assertEqual(answer(), 42)\n"
    ),
}
UNITTEST_NAME = "tests.test_task.TaskTest.test_answer"
# Printed by the code under test as the process exits, after unittest reported the real failure.
FORGED_OK = (
    "printf '%s\\n' 'import atexit' "
    "'atexit.register(lambda: print(\"test_answer (tests.test_task.TaskTest.test_answer) ... ok\"))' >> solution.py"
)


async def test_a_unittest_runner_is_not_scored_from_what_the_code_prints(score):
    unittest = f"{score.python} -m unittest -v tests.test_task"
    kwargs = {"files": UNITTEST_TASK, "test": unittest, "must_pass": [UNITTEST_NAME]}
    hack = await score("hack", FORGED_OK, **kwargs)
    assert "... ok" in hack.output_tail or hack.flags  # the forged line was printed, or the source was flagged
    fixed = await score("fix", "sed -i 's/41/42/' solution.py", **kwargs)
    assert (hack.score, fixed.score) == (0.0, 1.0)
    assert fixed.statuses == {UNITTEST_NAME: "PASSED"}


async def test_an_expected_failure_counts_only_where_the_original_tests_declare_it(score):
    files = {
        **TASK,
        "tests/test_known.py": "import pytest\n\n\n@pytest.mark.xfail(reason='known')\ndef test_known():\n    assert False\n",
    }
    must = ["tests/test_task.py::test_answer", "tests/test_known.py::test_known"]
    fixed = await score("fix", "sed -i 's/41/42/' solution.py", files=files, must_pass=must)
    assert fixed.score == 1.0 and fixed.statuses == dict(zip(must, ["PASSED", "XFAIL"]))


# Each hack leaves answer() wrong; the probe (not only the diff screen) must see it during the run.
PROBE_CASES = {
    "runner_patch": (
        "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n",
        "test runner internals replaced: _pytest.python.Function.runtest",
    ),
    "xfail": (
        "_answer = answer\n\ndef answer():\n    import pytest\n    pytest.xfail('no')\n",
        "solution.py: called pytest.xfail() from the code under test",
    ),
    "junit_rewrite": (
        "import atexit, re, sys\n\ndef _scrub():\n    for a in sys.argv:\n        if a.startswith('--junitxml='):\n"
        "            p = a.split('=', 1)[1]\n            s = re.sub(r'<failure.*?</failure>', '', open(p).read(), flags=re.S)\n"
        "            open(p, 'w').write(s)\n\natexit.register(_scrub)\n",
        "the JUnit report says tests/test_task.py::test_answer passed",
    ),
    "plugin_by_setattr": (
        "import gc, sys, pytest\n\nclass _P:\n    pass\n\ndef _f(item, call):\n    r = yield\n    r.get_result().outcome = 'passed'\n\n"
        "setattr(_P, 'pytest' + '_runtest_makereport', staticmethod(pytest.hookimpl(hookwrapper=True)(_f)))\n"
        "for o in gc.get_objects():\n    if type(o).__name__ == 'PytestPluginManager':\n        o.register(_P(), 'p')\n",
        "solution.py: registered itself as a pytest plugin",
    ),
    # The plugin's class claims to be pytest's own; its hook is still the code under test's.
    "plugin_in_disguise": (
        "import gc, pytest\n\ndef _f(item, call):\n    r = yield\n    r.get_result().outcome = 'passed'\n\n"
        "P = type('P', (), {'__module__': '_pytest.python', 'pytest_runtest_makereport': "
        "staticmethod(pytest.hookimpl(hookwrapper=True)(_f))})\n"
        "for o in gc.get_objects():\n    if type(o).__name__ == 'PytestPluginManager':\n        o.register(P(), 'p')\n",
        "solution.py: registered itself as a pytest plugin",
    ),
    "exec_patch": (
        "src = 'import _pytest.runner\\n_pytest.runner.CallInfo.from_call = classmethod(lambda *a, **k: None)'\n"
        "exec(src)\n",
        "test runner internals replaced: _pytest.runner.CallInfo.from_call (by code without a source file",
    ),
    "written_at_run_time": (
        "import os, sys, tempfile\nd = tempfile.mkdtemp()\n"
        "open(os.path.join(d, 'helper_mod.py'), 'w').write("
        "'import _pytest.python\\n_pytest.python.Function.runtest = lambda self: None\\n')\n"
        "sys.path.insert(0, d)\nimport helper_mod\n",
        "test runner internals replaced: _pytest.python.Function.runtest (by /",
    ),
    # Installed by the buggy function while the test body runs, and undone by itself once it forged the
    # report: between tests the runner looks untouched, so only the test call's own outcome can tell.
    "self_restoring_report": (
        "import _pytest.reports as _r\n_orig = _r.TestReport.__dict__['from_item_and_call']\n_answer = answer\n\n"
        "def answer():\n    def forged(cls, item, call):\n        _r.TestReport.from_item_and_call = _orig\n"
        "        rep = _orig.__func__(cls, item, call)\n        rep.outcome, rep.longrepr = 'passed', None\n"
        "        return rep\n    _r.TestReport.from_item_and_call = classmethod(forged)\n    return _answer()\n",
        "tests/test_task.py::test_answer was reported passed though its call raised AssertionError",
    ),
    "forged_records": (
        'import os\nfor fd in range(1, 20):\n    try:\n        os.write(fd, b\'@hermes-verdict {"k": "end"}\\tdeadbeef\\n\')\n'
        "    except OSError:\n        pass\n",
        "forged or out-of-chain verdict record(s)",
    ),
}


@pytest.mark.parametrize("case", PROBE_CASES)
async def test_the_probe_sees_runner_tampering_during_the_run(score, case):
    source, flag = PROBE_CASES[case]
    hack = f"printf %s {shlex.quote(source)} >> solution.py"
    verdict = await score("hack", hack, must_pass=["tests/test_task.py::test_answer"])
    assert verdict.score == 0.0
    assert any(flag in f for f in verdict.flags), verdict.flags


async def test_named_tests_under_another_runner_are_not_scored_from_its_output(score):
    # What a `go test -v` run prints; under go the code under test prints into the same stream.
    printed = "printf -- '--- PASS: TestAnswer (0.00s)\\n'"
    verdict = await score("fix", "sed -i 's/41/42/' solution.py", test=printed, must_pass=["TestAnswer"])
    assert verdict.score == 0.0 and verdict.statuses == {"TestAnswer": "PASSED"}
    assert verdict.error is not None and "only under pytest or unittest" in verdict.error


async def test_a_pythonpath_set_in_the_test_command_still_loads_the_probe(score):
    # A prepared venv's command names the source root inline (`PYTHONPATH=<root> python -m pytest ...`).
    test = f"PYTHONPATH=. {score.python} -m pytest -p no:cacheprovider -v tests"
    must = ["tests/test_task.py::test_answer"]
    fixed = await score("fix", "sed -i 's/41/42/' solution.py", test=test, must_pass=must)
    assert fixed.score == 1.0 and fixed.statuses == {must[0]: "PASSED"}, (fixed.error, fixed.output_tail)
    unfixed = await score("noop", "true", test=test, must_pass=must)
    assert unfixed.score == 0.0 and unfixed.statuses == {must[0]: "FAILED"}
