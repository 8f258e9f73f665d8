"""The probe's own defences, with the diff screen out of the way: the code under test (a file the agent
changed, imported while real pytest collects) finds the probe's objects in memory and tries to make a
failing test count as passed. Each attempt must leave the test failed or the run flagged.

The screen flags every route used here (gc walking, frames, closures); these tests show the probe does
not depend on it alone. Runs the probe as the verifier does (`TestVerifier.run_tests`: `-p <probe>` with its
config and fd 3), in a local directory with this machine's python and in a slot of a docker sandbox in the
verifier image with its own python3 and pytest (`verifier_at`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator

import pytest

from environments.verifier import TestVerifier, read_probe
from tests.security.conftest import running_sandbox
from tests.support.docker_engine import SandboxPlace
from tools.executor import LocalWorkspace, ToolExecutor

FIND = (
    "import gc\n\n"
    "_probe = next(m for m in gc.get_objects() if type(m).__name__ == 'module' and m.__name__.startswith('hermes_probe_'))\n"
    "_hooks = [f for f in gc.get_objects() if type(f).__name__ == 'function' and (f.__module__ or '').startswith('hermes_probe_')]\n"
    "_chan = next((o for o in gc.get_objects() if type(o).__name__ == '_Channel'), None)\n"
)
FORGE = (
    "lambda node, when, outcome, xfail=False, declared=True: _orig(node, when, 'passed' if when == 'call' else outcome)"
)

ATTACKS = {
    # on the instance: its methods cannot be shadowed (and the hooks do not look them up there)
    "instance": FIND + f"_orig = _chan.report\ntry:\n    _chan.report = {FORGE}\n    _chan.tamper = lambda what: None\n"
    "except AttributeError:\n    pass\n",
    # on the class: the hooks call the functions they captured, and the class is checked
    "class": FIND + "_orig_fn = type(_chan).report\n_orig = lambda *a: _orig_fn(_chan, *a)\n"
    f"type(_chan).report = lambda self, *a, **k: ({FORGE})(*a)\ntype(_chan).tamper = lambda self, what: None\n"
    "type(_chan).check = lambda self: None\n",
    # a module global of the probe (its helper functions, the report hook)
    "module_globals": FIND + "_probe._foreign = lambda path: None\n_probe._replaced = lambda entries: []\n",
    # the hooks' captured channel, swapped for a forger
    "hook_closure": FIND + "class _Fake:\n    def __getattr__(self, name):\n        return getattr(_chan, name)\n"
    "    def report(self, node, when, outcome, **k):\n        _chan.report(node, when, 'passed' if when == 'call' else outcome)\n"
    "    def tamper(self, what):\n        pass\n"
    "for _h in _hooks:\n    for _cell in _h.__closure__ or ():\n"
    "        if _cell.cell_contents is _chan:\n            _cell.cell_contents = _Fake()\n",
    # the code of a probe function (the one that judges where a replacement came from), not the function
    "function_code": FIND + "_probe._foreign.__code__ = (lambda path: None).__code__\n"
    "_orig_fn = type(_chan).report\n_orig = lambda *a: _orig_fn(_chan, *a)\n"
    f"type(_chan).report = lambda self, *a, **k: ({FORGE})(*a)\n",
    # the standard library the probe serialises with
    "stdlib": "import json\n_d = json.dumps\n"
    "json.dumps = lambda r, **k: _d({**r, 'outcome': 'passed'} if r.get('k') == 'report' else r, **k)\n",
}


ARMED = "\nopen('attack-armed', 'w').close()\n"  # the attack's code ran to its end (written in the checkout)
PYTEST = "-m pytest -q -p no:cacheprovider tests"


@contextlib.asynccontextmanager
async def _workspace(place: SandboxPlace) -> AsyncIterator[tuple[ToolExecutor, str]]:
    """A workspace to verify in and its python: a plain local directory, or a slot of a docker sandbox in the
    verifier image (the image's python3 and pytest)."""
    if place.kind == "local":
        yield LocalWorkspace(place.tmp_path / "ws"), sys.executable
        return
    async with running_sandbox(place, slots=1) as pool, pool.trajectory("probe") as executor:
        yield executor, "python3"


async def _run(place: SandboxPlace, attack: str) -> tuple[dict[str, str], list[str], bool]:
    async with _workspace(place) as (executor, python):
        await executor.write_file(
            "repo/tests/test_pkg.py", b"import pkg\n\n\ndef test_div():\n    assert pkg.div(7, 2) == 3.5\n"
        )
        # written before the run starts, as the verifier's checkout is (the probe trusts nothing newer)
        source = "def div(a, b):\n    return a // b\n\n\n" + attack + ARMED
        await executor.write_file("repo/pkg/__init__.py", source.encode())
        # as the verifier runs the tests: `-p <probe>` with its config, fd 3 its pipe, the run's output to a log
        run = await TestVerifier().run_tests(
            executor, dest="repo", test_command=f"{python} {PYTEST}", changed=["pkg/__init__.py"]
        )
        armed = await executor.exec("test -e repo/attack-armed", timeout=30, max_output_bytes=1000)
    assert "@hermes-verdict " in run.log and armed.exit_code == 0, run.log[-3000:]
    return read_probe(run.log)


async def test_the_failing_test_is_reported_failed_without_an_attack(verifier_at):
    statuses, flags, ended = await _run(verifier_at, "")
    assert (statuses, flags, ended) == ({"tests/test_pkg.py::test_div": "FAILED"}, [], True)


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_code_under_test_cannot_forge_through_the_probes_objects(verifier_at, name):
    statuses, flags, ended = await _run(verifier_at, ATTACKS[name])
    won = statuses == {"tests/test_pkg.py::test_div": "PASSED"} and not flags and ended
    assert not won, (statuses, flags)
