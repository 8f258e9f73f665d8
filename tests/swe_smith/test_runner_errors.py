"""A test process that cannot start says why in the verdict, in the runner's own words (one line)."""

from __future__ import annotations

import sys

from environments.verifier import TestVerifier
from tools.executor import LocalWorkspace, ToolExecutor

# A repository whose pytest configuration names pytest-cov's option, run with plugin autoload off (or
# without pytest-cov installed): pytest stops at argument parsing, before the probe could report anything.
PYPROJECT = '[tool.pytest.ini_options]\naddopts = "--cov=pkg --cov-report=term-missing -rxXs"\n'


async def test_an_unknown_option_from_the_repositorys_addopts_is_the_error(tmp_path):
    async def prepare(executor: ToolExecutor, dest: str) -> None:
        await executor.write_file(f"{dest}/pyproject.toml", PYPROJECT.encode())
        await executor.write_file(f"{dest}/pkg/__init__.py", b"def one():\n    return 1\n")
        await executor.write_file(
            f"{dest}/tests/test_pkg.py", b"import pkg\n\n\ndef test_one():\n    assert pkg.one() == 1\n"
        )

    verdict = await TestVerifier().verify(
        LocalWorkspace(tmp_path / "ws"),
        prepare=prepare,
        patch="",
        test_command=f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -p no:cacheprovider tests",
        must_pass=["tests/test_pkg.py::test_one"],
    )
    assert verdict.score == 0.0 and verdict.statuses == {"tests/test_pkg.py::test_one": "MISSING"}
    assert verdict.error is not None and "\n" not in verdict.error
    assert verdict.error.startswith("the test process ended without reporting its end (exit 4): ")
    assert verdict.error.endswith("error: unrecognized arguments: --cov=pkg --cov-report=term-missing"), verdict.error


async def test_a_conftest_that_cannot_import_is_the_error(tmp_path):
    async def prepare(executor: ToolExecutor, dest: str) -> None:
        await executor.write_file(f"{dest}/tests/conftest.py", b"import not_installed_anywhere\n")
        await executor.write_file(f"{dest}/tests/test_pkg.py", b"def test_one():\n    pass\n")

    verdict = await TestVerifier().verify(
        LocalWorkspace(tmp_path / "ws"),
        prepare=prepare,
        patch="",
        test_command=f"{sys.executable} -m pytest -p no:cacheprovider tests",
        must_pass=["tests/test_pkg.py::test_one"],
    )
    assert verdict.score == 0.0 and verdict.error is not None and "\n" not in verdict.error
    assert verdict.error.endswith("ModuleNotFoundError: No module named 'not_installed_anywhere'"), verdict.error
