"""The probe's own defences, with the diff screen out of the way: the code under test (a file the agent
changed, imported while real pytest collects) finds the probe's objects in memory and tries to make a
failing test count as passed. Each attempt must leave the test failed or the run flagged.

The screen flags every route used here (gc walking, frames, closures); these tests show the probe does
not depend on it alone. Runs the probe as the verifier does: `-p <probe>` with its config and fd 3.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from environments.verifier import _PROBE_SOURCE, read_probe

FIND = (
    "import gc\n\n"
    "_probe = next(m for m in gc.get_objects() if type(m).__name__ == 'module' and m.__name__ == 'hermes_probe_t')\n"
    "_hooks = [f for f in gc.get_objects() if type(f).__name__ == 'function' and f.__module__ == 'hermes_probe_t']\n"
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


def _run(tmp_path: Path, attack: str) -> tuple[dict[str, str], list[str], bool]:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_pkg.py").write_text("import pkg\n\n\ndef test_div():\n    assert pkg.div(7, 2) == 3.5\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "hermes_probe_t.py").write_text(_PROBE_SOURCE.read_text())
    (run / "hermes_probe_t.json").write_text(json.dumps({"fd": 3, "changed": ["pkg/__init__.py"]}))
    # written before the run starts, as the verifier's checkout is (the probe trusts nothing newer)
    (repo / "pkg" / "__init__.py").write_text("def div(a, b):\n    return a // b\n\n\n" + attack)
    # as the verifier's script: fd 3 is the probe's pipe (here our stdout), the run's own output goes to a log
    command = (
        f'exec 3>&1 >"{run}/log" 2>&1; exec {sys.executable} -m pytest -q -p hermes_probe_t -p no:cacheprovider tests'
    )
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=repo,
        env={"PYTHONPATH": str(run), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    records = proc.stdout
    assert "@hermes-verdict " in records, (run / "log").read_text()
    return read_probe(records)


def test_the_failing_test_is_reported_failed_without_an_attack(tmp_path):
    statuses, flags, ended = _run(tmp_path, "")
    assert (statuses, flags, ended) == ({"tests/test_pkg.py::test_div": "FAILED"}, [], True)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_code_under_test_cannot_forge_through_the_probes_objects(tmp_path, name):
    statuses, flags, ended = _run(tmp_path, ATTACKS[name])
    won = statuses == {"tests/test_pkg.py::test_div": "PASSED"} and not flags and ended
    assert not won, (statuses, flags)
