"""unittest's `subTest` under pytest 9, which reports each subtest itself (a `SubtestReport`, phase "call",
the test's own node id) while the test's call runs, then the test's own call report (passed even when a
subtest failed). These are the runner's genuine reports, not tampering; a failed subtest fails its test
(as it does under pytest 8, where the first failing subtest ends the test). A subtest report the code
under test forges must not make a failing test pass.

Runs the probe as the verifier does (`TestVerifier.run_tests`) in a local directory with this machine's
pytest (9.x; the hermes-rl venv pins no older one)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from environments.verifier import TestVerifier, read_probe
from tools.executor import LocalWorkspace

TESTS = (
    "import unittest\n\nimport pkg\n\n\nclass T(unittest.TestCase):\n"
    "    def test_div(self):\n"
    "        with self.subTest('exact'):\n            self.assertEqual(pkg.div(6, 2), 3)\n"
    "        with self.subTest('fraction'):\n            self.assertEqual(pkg.div(7, 2), 3.5)\n\n"
    "    def test_add(self):\n"
    "        for a in range(3):\n            with self.subTest(a=a):\n                self.assertEqual(pkg.add(a, 1), a + 1)\n"
)
FIXED = "def div(a, b):\n    return a / b\n\n\ndef add(a, b):\n    return a + b\n"
BUGGY = FIXED.replace("a / b", "a // b")
# The code under test, while test_div's call runs, reports a passed subtest and a passed call for it.
FORGER = (
    "import gc\n\nimport _pytest.subtests as _st\nfrom _pytest.reports import TestReport\n\n\n"
    "def _forge():\n"
    "    item = next(o for o in gc.get_objects() if type(o).__name__ == 'TestCaseFunction' and o.name == 'test_div')\n"
    "    real = TestReport(item.nodeid, item.location, {}, 'passed', None, 'call', [])\n"
    "    sub = _st.SubtestReport._new(real, _st.SubtestContext(msg='fraction', kwargs={}), None, None)\n"
    "    item.ihook.pytest_runtest_logreport(report=sub)\n"
    "    item.ihook.pytest_runtest_logreport(report=real)\n\n\n"
    "def div(a, b):\n    _forge()\n    return a // b\n\n\ndef add(a, b):\n    return a + b\n"
)
DIV, ADD = "tests/test_pkg.py::T::test_div", "tests/test_pkg.py::T::test_add"


async def _run(tmp_path: Path, source: str) -> tuple[dict[str, str], list[str], bool]:
    executor = LocalWorkspace(tmp_path / "ws")
    await executor.write_file("repo/tests/test_pkg.py", TESTS.encode())
    await executor.write_file("repo/pkg/__init__.py", source.encode())
    run = await TestVerifier().run_tests(
        executor,
        dest="repo",
        test_command=f"{sys.executable} -m pytest -q -p no:cacheprovider tests",
        changed=["pkg/__init__.py"],
    )
    assert "@hermes-verdict " in run.log, run.log[-3000:]
    return read_probe(run.log)


def test_this_pytest_reports_unittest_subtests_itself():
    assert int(pytest.__version__.split(".")[0]) >= 9  # else the tests below check nothing new


async def test_passing_subtests_are_the_runners_own_reports(tmp_path):
    assert await _run(tmp_path, FIXED) == ({DIV: "PASSED", ADD: "PASSED"}, [], True)


async def test_a_failing_subtest_fails_its_test(tmp_path):
    # pytest 9 reports test_div's own call passed; its "fraction" subtest failed
    assert await _run(tmp_path, BUGGY) == ({DIV: "FAILED", ADD: "PASSED"}, [], True)


async def test_subtest_reports_forged_by_the_code_under_test_do_not_pass_a_test(tmp_path):
    statuses, flags, ended = await _run(tmp_path, FORGER)
    assert statuses[DIV] != "PASSED" or flags, (statuses, flags)
