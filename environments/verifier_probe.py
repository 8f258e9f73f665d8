"""Loaded into the test process before the code under test; reports each test's outcome down a pipe.

Not imported by hermes-rl: `environments.verifier` ships this file's text into the verified checkout's
private temp dir and loads it as a pytest plugin (`-p <name>`) or runs it as the unittest runner
(`python -m <name> unittest ...`). Standard library (and pytest) only.

Why: the code under test runs in the same process as the runner, so anything the runner writes to a file
afterwards (JUnit XML, stdout) can be rewritten by it. Here each outcome is written as it happens to a
pipe the verifier reads (fd 3); nothing written there can be taken back. Records are chained with an
HMAC whose key is drawn, and sent first, before the code under test is imported, so lines it forges
into the pipe do not verify. The probe also snapshots the runner's functions and classes at import and
reports any that were replaced, and reports plugins registered from the files the agent changed and
expected failures raised from them. It is built only from the standard library: before importing anything
else it puts the stdlib first on sys.path (the repository's paths after it), and it starts
`verifier_watch` (shipped beside it) for values and file reads the tests' comparisons depend on. A
determined in-process attacker can still defeat all of this (e.g. by finding the key in memory); the
verifier's static screen of the diff is the other half.
"""

from __future__ import annotations

import os
import sys

# The test command's PYTHONPATH, moved here by the verifier: on PYTHONPATH it would come before the stdlib, so an
# agent's `src/json/__init__.py` would run as the interpreter starts and be what this probe is built from.
_PATH_VAR = "HERMES_PROBE_PYTHONPATH"


def _stdlib_first() -> list[str]:
    """Puts the standard library before every other entry of sys.path, the command's PYTHONPATH right after it
    (where PYTHONPATH would have put it, but behind the stdlib), and gives that PYTHONPATH back to the
    environment for programs the tests start. Runs before the probe imports anything not yet loaded.
    Returns the entries of sys.path inside the checkout (the repository's, whoever added them)."""
    stdlib = os.path.realpath(os.path.dirname(os.__file__))

    def is_stdlib(entry: str) -> bool:
        real = os.path.realpath(entry or ".")
        if {"site-packages", "dist-packages"} & set(real.split(os.sep)):
            return False
        zipped = real.endswith(".zip") and os.path.dirname(real) == os.path.dirname(stdlib)
        return zipped or real == stdlib or real.startswith(stdlib + os.sep)

    here = os.path.realpath(os.path.dirname(__file__))
    given = [p for p in os.environ.pop(_PATH_VAR, "").split(os.pathsep) if p and os.path.realpath(p) != here]
    first = next((i for i, e in enumerate(sys.path) if is_stdlib(e)), len(sys.path))
    before, after = sys.path[:first], sys.path[first:]
    early: list[str] = []
    for entry in before:  # the script's or the current directory, then PYTHONPATH (this probe's directory)
        early += [*given, entry] if os.path.realpath(entry or ".") == here else [entry]
    if here not in map(os.path.realpath, before):
        early += given
    # The one edit of the test process's search path: this order is the trust root (stdlib first).
    sys.path[:] = [e for e in after if is_stdlib(e)] + early + [e for e in after if not is_stdlib(e)]
    if given:
        os.environ["PYTHONPATH"] = os.pathsep.join(given)
    root = os.path.realpath(os.getcwd())
    return [e for e in sys.path if (os.path.realpath(e or ".") + os.sep).startswith(root + os.sep)]


_REPO_PATHS = _stdlib_first()

import importlib  # noqa: E402 - from the standard library only once it comes first
import json  # noqa: E402
import site  # noqa: E402
import sysconfig  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from hashlib import sha256 as _sha256  # noqa: E402
from hmac import new as _hmac_new  # noqa: E402
from json import dumps as _dumps  # noqa: E402
from pathlib import Path  # noqa: E402
from types import TracebackType  # noqa: E402
from typing import Any  # noqa: E402

PREFIX = "@hermes-verdict "
_CONFIG = json.loads(Path(__file__).with_suffix(".json").read_text())
# The pipe moves off the fd number the command gave it and is not inherited by programs the tests start:
# code under test can no longer just write to fd 3 (it can still search its own fds: see docs/security.md).
_FD = os.dup(_CONFIG["fd"])
os.close(_CONFIG["fd"])
_CHANGED: frozenset[str] = frozenset(_CONFIG["changed"])
_ROOT = os.getcwd()
_STARTED = time.time()
# The interpreter's own files: its stdlib and every site-packages it has, the system ones too (a venv with
# system site-packages, Debian's dist-packages where apt's python3-pytest lives).
_SYSTEM_DIRS = tuple(
    os.path.realpath(d) + os.sep
    for d in [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    + list(site.getsitepackages())
)
_WATCHED = ("_pytest", "pytest", "pluggy", "unittest")


def _changed_file(path: str) -> str | None:
    """The changed file (relative to the checkout) that `path` is, if it is one."""
    rel = os.path.relpath(os.path.realpath(path), _ROOT)
    return rel if rel in _CHANGED else None


def _stdlib_has(module: str) -> bool:
    """Whether `module` is the standard library's. (Not site-packages': there the project itself may be installed,
    and the checkout's copy is meant to come first.)"""
    return module in sys.builtin_module_names or module in getattr(sys, "stdlib_module_names", ())


def _before_the_probe() -> list[str]:
    """Tampering visible as the probe starts: a changed file already imported (it ran before the probe), and a
    changed file in one of the repository's entries of sys.path named like a module of the standard library
    (the repository's entries now come after the stdlib, so it is not imported, but nothing else has a reason
    to be named so)."""
    found = []
    for name, loaded in list(sys.modules.items()):
        file = getattr(loaded, "__file__", None)
        changed = _changed_file(file) if isinstance(file, str) else None
        if changed:
            found.append(f"{changed}: ran before the verifier's probe (imported as {name})")
    for entry in dict.fromkeys(_REPO_PATHS):
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            module, file = name.partition(".")[0], os.path.join(entry or ".", name)
            if os.path.isdir(file):
                file = os.path.join(file, "__init__.py")
            elif not name.endswith((".py", ".pyc", ".so", ".pyd")):
                continue
            changed = _changed_file(file) if os.path.isfile(file) else None
            if changed and module.isidentifier() and _stdlib_has(module):
                found.append(f"{changed}: shadows the standard library's {module}")
    return found


_BEFORE = _before_the_probe()
# Bound now (as are sha256, hmac.new, json.dumps above): a later replaced stdlib function does not reach the probe.
_write = os.write
_urandom = os.urandom


# (label, live namespace, key, object found there, its code object)
_Entry = tuple[str, Any, str, Any, Any]


def _snapshot() -> list[_Entry]:
    """The runner's modules, their functions and classes, and the classes' members, as found at import."""
    entries: list[_Entry] = []
    for name, module in list(sys.modules.items()):
        watched = name.split(".")[0] in _WATCHED or name == __name__  # the probe watches itself too
        if not watched or name.startswith("unittest.mock") or module is None:
            continue
        entries.append((name, sys.modules, name, module, None))
        namespace = vars(module)
        for key, value in list(namespace.items()):
            if isinstance(value, type) and value.__module__ == name:
                entries.append((f"{name}.{key}", namespace, key, value, None))
                members = vars(value)  # a live view: later replacements show
                for attr, member in list(members.items()):
                    if callable(member) or isinstance(member, (property, classmethod, staticmethod)):
                        entries.append(
                            (f"{name}.{key}.{attr}", members, attr, member, getattr(member, "__code__", None))
                        )
            elif callable(value):
                entries.append((f"{name}.{key}", namespace, key, value, getattr(value, "__code__", None)))
    return entries


def _replaced(entries: list[_Entry]) -> list[str]:
    """What was replaced by something foreign: from a file the agent changed, or without code to trace.

    pytest and installed plugins patch pytest too (legacypath, fixtures), with functions of their own
    files: those are accepted. Each replacement is judged once (the entry then holds the new object).
    """
    out = []
    for i, (label, namespace, key, was, code) in enumerate(entries):
        now = namespace.get(key)
        now_code = getattr(now, "__code__", None)
        if now is was and now_code is code:
            continue
        entries[i] = (label, namespace, key, now, now_code)
        foreign = _foreign(_origin(now))
        if foreign:
            out.append(f"{label} (by {foreign})")
    return out


def _origin(obj: Any) -> str | None:
    """The source file of a function, method, property, partial, class or module."""
    for _ in range(10):
        if isinstance(obj, (property,)):
            obj = obj.fget
        elif isinstance(obj, (classmethod, staticmethod)) or hasattr(obj, "__func__"):
            obj = obj.__func__
        elif hasattr(obj, "func") and callable(obj.func):  # functools.partial
            obj = obj.func
        else:
            break
    code = getattr(obj, "__code__", None)
    if code is not None:
        return str(code.co_filename)
    if isinstance(obj, type):
        return getattr(sys.modules.get(obj.__module__), "__file__", None)
    return getattr(obj, "__file__", None)


class _Channel:
    """HMAC-chained JSON records to the verifier's pipe.

    No instance dict: its methods cannot be shadowed on the object (`channel.report = forger`). The hooks
    hold it and this class's functions in closures (not module globals), and `_seal` reports any change
    to the class, the probe's globals or the hooks' code and closures.
    """

    __slots__ = ("_key", "_mac", "_snap")

    def __init__(self, runner: str) -> None:
        self._key = _urandom(32)
        self._mac = b""
        self._snap = _snapshot()
        self._send({"k": "start", "runner": runner, "key": self._key.hex()}, keyed=False)

    def _send(self, record: dict[str, Any], *, keyed: bool = True) -> None:
        payload = _dumps(record, sort_keys=True, separators=(",", ":"))
        if keyed:
            self._mac = _hmac_new(self._key, self._mac + payload.encode(), _sha256).digest()[:16]
        else:
            self._mac = _sha256(payload.encode()).digest()[:16]
        data = f"{PREFIX}{payload}\t{self._mac.hex()}\n".encode()
        while data:  # a pipe may take a long record in pieces
            data = data[_write(_FD, data) :]

    def check(self) -> None:
        replaced = _replaced(self._snap)
        if replaced:
            self._send({"k": "tamper", "what": f"test runner internals replaced: {', '.join(replaced[:5])}"})

    def report(self, node: str, when: str, outcome: str, *, xfail: bool = False, declared: bool = True) -> None:
        if when != "call" and outcome == "passed" and not xfail:
            return  # a passed setup or teardown says nothing; big suites' records must fit the output cap
        if when == "call":
            self.check()
        self._send(
            {"k": "report", "node": node, "when": when, "outcome": outcome, "xfail": xfail, "declared": declared}
        )

    def tamper(self, what: str) -> None:
        self._send({"k": "tamper", "what": what})

    def end(self) -> None:
        self.check()
        self._send({"k": "end"})


def _seal(channel: _Channel, hooks: list[Callable[..., Any]]) -> Callable[[], None]:
    """A check that reports, once, any change since now to the channel's class, the probe module's globals,
    or the code, defaults and closures of the hooks and the probe's functions. Nothing of the probe's own changes in an honest run, so
    every change counts (no judging where the replacement came from, as `_replaced` must for pytest).
    The check itself and what it compares against live only in its closure.
    """
    cls, send, module = type(channel), _Channel._send, sys.modules[__name__]
    members, names = dict(vars(cls)), dict(vars(module))

    def state(fn: Any) -> tuple[Any, ...]:
        cells = tuple(c.cell_contents if _filled(c) else None for c in getattr(fn, "__closure__", None) or ())
        return (
            getattr(fn, "__code__", None),
            getattr(fn, "__defaults__", None),
            getattr(fn, "__kwdefaults__", None),
            cells,
        )

    functions = [v for v in [*names.values(), *members.values()] if hasattr(v, "__code__")]
    states = [(fn, state(fn)) for fn in [*hooks, *functions]]
    reported = [False]

    def check() -> None:
        if reported[0]:
            return
        changed = [
            f"{cls.__name__}.{k}" for k in set(members) | set(vars(cls)) if vars(cls).get(k) is not members.get(k)
        ]
        now = vars(module)
        changed += [f"probe global {k}" for k, v in names.items() if now.get(k) is not v]
        changed += [f"function {fn.__name__}" for fn, was in states if state(fn) != was]
        if type(channel) is not cls:
            changed.append("the channel's class")
        if changed:
            reported[0] = True
            send(
                channel,
                {"k": "tamper", "what": f"the verifier's probe was modified: {', '.join(sorted(set(changed))[:5])}"},
            )

    states.append((check, state(check)))  # a check whose closure or code was swapped shows in the next one
    return check


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # not yet assigned
        return False
    return True


def _foreign(path: str | None) -> str | None:
    """Why code from `path` is not the runner's, the tests' or the original checkout's (None: it is).

    Trusted: the interpreter's stdlib and site-packages (pytest, its plugins) unless the file is an
    installed copy of a changed file, and checkout files the agent did not change and nothing rewrote
    since the probe started. Everything else (changed files, files written during the run, exec'd code
    with no file) is the code under test's.
    """
    if not path or not os.path.isfile(path):
        return f"code without a source file ({path})"
    real = os.path.realpath(path)
    for changed in _CHANGED:
        if real.endswith("/" + changed) or real.endswith("/" + changed.removeprefix("src/")):
            return changed
    rel = os.path.relpath(real, _ROOT)
    if not rel.startswith(".."):
        return None if os.stat(real).st_mtime < _STARTED else f"{rel} (written during the run)"
    if real.startswith(_SYSTEM_DIRS):
        return None
    return f"{real} (outside the checkout and the interpreter)"


def _start_watch(channel: _Channel) -> Callable[[], None]:
    """`verifier_watch`, shipped beside this file: its audit hook, and the check to run after each passing test."""
    watch = importlib.import_module(Path(__file__).stem + "_watch")
    tamper = _Channel.tamper
    return watch.start(_ROOT, _changed_file, lambda what: tamper(channel, what))


def _module_file(obj: object) -> str | None:
    module = obj if type(obj).__name__ == "module" else sys.modules.get(getattr(type(obj), "__module__", ""))
    return getattr(module, "__file__", None)


# -- as a pytest plugin ----------------------------------------------------------------------------------

if __name__ != "__main__":
    import pytest

    # pytest >= 9 reports unittest's subTest (and its `subtests` fixture) itself, during the test's call
    _SubtestReport: type | None = getattr(sys.modules.get("_pytest.subtests"), "SubtestReport", None)

    def _pytest_hooks() -> dict[str, Any]:
        """The plugin's hooks, holding the channel and their state in closures: not reachable as globals."""
        channel = _Channel("pytest")
        for what in _BEFORE:
            channel.tamper(what)
        after_test = _start_watch(channel)
        send_report, tamper, end, check_runner = _Channel.report, _Channel.tamper, _Channel.end, _Channel.check
        declared_xfail: dict[str, bool] = {}
        # What each test body itself raised (None: nothing), seen before any report is built from it. A
        # report forger the code under test installs during the test and undoes before the next check
        # leaves the runner looking untouched; the call it forged a report for does not.
        raised: dict[str, str | None] = {}  # the exception's type name: holding it would keep its frames
        running: set[str] = set()  # tests whose call is running now: where pytest's subtest reports come from
        module = sys.modules[__name__]
        guard: list[Callable[[], None]] = []  # the sealed check, once the hooks it covers exist

        def pytest_plugin_registered(plugin: object, manager: object) -> None:
            if plugin is module:
                return
            file = _module_file(plugin)
            foreign = _foreign(file) if file else None
            # The hooks themselves too: an object whose class claims a trusted module can carry foreign hooks.
            hooks = (getattr(plugin, name, None) for name in dir(plugin) if name.startswith("pytest_"))
            origins = (_origin(hook) for hook in hooks if callable(hook))
            foreign = foreign or next((f for f in map(_foreign, filter(None, origins)) if f), None)
            if foreign:
                tamper(channel, f"{foreign}: registered itself as a pytest plugin")

        def pytest_collection_finish(session: pytest.Session) -> None:
            guard[0]()
            check_runner(channel)
            for item in session.items:  # markers as the tests and their conftest files set them
                declared_xfail[item.nodeid] = item.get_closest_marker("xfail") is not None

        # Old-style wrappers (`hookwrapper`): the new style (`wrapper`) needs pytest >= 8 / pluggy >= 1.2, and
        # the probe runs on whatever pytest the instance's image has (bookworm's is 7.2, SWE-smith pins older).
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
            yield  # observes only: the report is pytest's
            excinfo = call.excinfo
            if excinfo is not None and excinfo.errisinstance(pytest.xfail.Exception):
                # The frame that called pytest.xfail(): a test may, the code under test may not.
                tb: TracebackType | None = excinfo.tb
                raiser = None
                while tb is not None:
                    if "_pytest" not in Path(tb.tb_frame.f_code.co_filename).parts:
                        raiser = tb.tb_frame.f_code.co_filename
                    tb = tb.tb_next
                foreign = _foreign(raiser)
                if foreign:
                    tamper(channel, f"{foreign}: called pytest.xfail() from the code under test")
                    declared_xfail[item.nodeid] = False
                elif not declared_xfail.get(item.nodeid):
                    declared_xfail[item.nodeid] = True

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(item: pytest.Item) -> Any:
            running.add(item.nodeid)
            outcome = yield
            running.discard(item.nodeid)
            exc = outcome.excinfo  # (type, value, traceback) of what the body raised, or None
            raised[item.nodeid] = exc[0].__name__ if exc else None
            if exc is None:
                after_test()

        def pytest_runtest_logreport(report: pytest.TestReport) -> None:
            guard[0]()
            if _SubtestReport is not None and isinstance(report, _SubtestReport) and report.when == "call":
                # Not the test's call: a failed one fails the test, a passed one passes nothing (so one the
                # code under test forges gains nothing). Outside its test's call it is not pytest's.
                if report.nodeid not in running:
                    tamper(channel, f"{report.nodeid}: a subtest was reported outside its test's call")
                send_report(channel, report.nodeid, "subtest", report.outcome, xfail=hasattr(report, "wasxfail"))
                return
            if report.when == "call":
                ran, exc = report.nodeid in raised, raised.pop(report.nodeid, None)
                if report.outcome == "passed" and not ran:
                    tamper(channel, f"{report.nodeid} was reported passed for a call that never ran")
                elif report.outcome == "passed" and exc is not None:
                    tamper(channel, f"{report.nodeid} was reported passed though its call raised {exc}")
            xfail = hasattr(report, "wasxfail")
            declared = declared_xfail.get(report.nodeid, False) if xfail else True
            send_report(channel, report.nodeid, report.when, report.outcome, xfail=xfail, declared=declared)

        def pytest_unconfigure(config: pytest.Config) -> None:
            guard[0]()
            end(channel)

        hooks = {k: v for k, v in locals().items() if k.startswith("pytest_")}
        module.__dict__.update(hooks)  # pytest finds a plugin module's hooks among its attributes
        channel._snap = _snapshot()  # now, so it includes the hooks
        guard.append(_seal(channel, list(hooks.values())))
        return hooks

    _pytest_hooks()


# -- as the unittest runner: python -m <this module> unittest <unittest's arguments> ---------------------


def _unittest_main() -> None:
    import unittest

    channel = _Channel("unittest")
    for what in _BEFORE:
        channel.tamper(what)
    after_test = _start_watch(channel)
    report = _Channel.report
    sealed = _seal(channel, [])

    def record(test: unittest.TestCase, outcome: str, *, xfail: bool = False) -> None:
        if outcome == "passed":
            after_test()
        sealed()
        report(channel, test.id(), "call", outcome, xfail=xfail)

    class Result(unittest.TextTestResult):
        def addSuccess(self, test: unittest.TestCase) -> None:
            super().addSuccess(test)
            record(test, "passed")

        def addFailure(self, test: unittest.TestCase, err: Any) -> None:
            super().addFailure(test, err)
            record(test, "failed")

        def addError(self, test: unittest.TestCase, err: Any) -> None:
            super().addError(test, err)
            record(test, "failed")

        def addSkip(self, test: unittest.TestCase, reason: str) -> None:
            super().addSkip(test, reason)
            record(test, "skipped")

        def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
            super().addExpectedFailure(test, err)
            record(test, "skipped", xfail=True)  # @expectedFailure: declared by the test

        def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
            super().addUnexpectedSuccess(test)
            record(test, "passed", xfail=True)

    class Runner(unittest.TextTestRunner):
        resultclass = Result  # type: ignore[assignment]

    try:
        unittest.main(module=None, argv=["python -m unittest", *sys.argv[2:]], testRunner=Runner)
    finally:
        sealed()
        _Channel.end(channel)


if __name__ == "__main__":
    _unittest_main()
