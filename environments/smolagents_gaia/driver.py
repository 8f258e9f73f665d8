"""The program that runs one code action inside the slot (stdlib only; it never runs in our process).

The executor sends this file's source on the interpreter's stdin, followed by one call of
`_codeact_run(<payload>)`. The payload (base64 JSON) holds the code action, the answers to
host call-outs made so far in this action, and the names of the tools to define; never a key
or a host path. State between actions lives in the slot's workspace under `.codeact/`:
the definitions (imports, functions, classes) of earlier actions are run again, and every
other global that pickles is restored, so the model's objects never leave the slot.

Observations follow smolagents' own `LocalPythonExecutor`: `print` writes its arguments joined by
spaces and a newline (keyword arguments ignored, as there); the action's value is the value of its
last top-level statement as smolagents' interpreter defines it (an expression's value, an
assignment's assigned value, an augmented assignment's new value, a definition's object, an
`if`/`for`'s last non-None inner value, None for everything else), sent back as `str(value)`; an
exception names the top-level statement that raised it in smolagents' wording. Variables given
to `agent.run(additional_args=...)` arrive pickled by the host and are loaded here, in the slot.

Outcome (written to `.codeact/result.json`, read back by the executor):
`ok` (with `str` of the action's value), `final` (the value given to `final_answer`: itself when it
is a JSON value that round-trips unchanged, else its `str`), `error` (smolagents' message), or
`callout` (a host tool was called whose answer is not in the payload yet: the executor answers it
and runs the action again from the saved state).
"""

# ruff: noqa
# mypy: ignore-errors
from __future__ import annotations

import ast
import base64
import builtins
import importlib
import json
import os
import pickle
import sys
import traceback
import types

_STATE = ".codeact"


class _FinalAnswer(BaseException):  # BaseException: a bare `except Exception` in the model's code cannot swallow it
    pass


class _CallOut(BaseException):
    pass


def _jsonable(value):
    """`value` itself when JSON carries it unchanged (a tuple does not: it comes back a list), else `str(value)`."""
    try:
        same = json.loads(json.dumps(value)) == value
    except (TypeError, ValueError, RecursionError):
        same = False
    return value if same and _plain(value) else str(value)


def _plain(value):
    if value is None or type(value) in (str, int, float, bool):
        return True
    if type(value) is list:
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    return False


def _print(*args, **kwargs):
    """smolagents' print: arguments joined by spaces, one newline; `sep`, `end` and `file` are ignored there too."""
    sys.stdout.write(" ".join(map(str, args)) + "\n")


class _Last:
    """The running value of one top-level statement, as smolagents' interpreter reports it."""

    value = None

    def __call__(self, value):
        if value is not None:
            self.value = value
        return value


_RECORD = "__codeact_record__"


def _reports(body):
    """`body` with every statement whose value smolagents reports passing that value to the recorder."""
    out = []
    for node in body:
        if isinstance(node, ast.Expr):
            node.value = _recorded(node.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            node.value = _recorded(node.value)
        elif isinstance(node, ast.If):
            node.body, node.orelse = _reports(node.body), _reports(node.orelse)
        elif isinstance(node, ast.For):  # the `else:` clause runs but reports nothing, as there
            node.body = _reports(node.body)
        out.append(node)
        if isinstance(node, ast.AugAssign):  # the target's new value
            target = ast.parse(ast.unparse(node.target), mode="eval").body
            out.append(ast.copy_location(ast.Expr(_recorded(target)), node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(ast.copy_location(ast.Expr(_recorded(ast.Name(node.name, ast.Load()))), node))
    return out


def _recorded(expr):
    return ast.copy_location(ast.Call(ast.Name(_RECORD, ast.Load()), [expr], []), expr)


def _run_statements(code, ns):
    """Run `code` one top-level statement at a time; the value smolagents would show, or an error in its wording."""
    try:
        tree = ast.parse(code)  # smolagents' filename (<unknown>) so the message reads the same
    except SyntaxError as e:
        raise _Failed(
            f"Code parsing failed on line {e.lineno} due to: {type(e).__name__}: {str(e)}\n"
            f"{e.text}{' ' * (e.offset or 0)}^"
        )
    last = _Last()
    ns[_RECORD] = last
    result = None
    for node in tree.body:
        segment = ast.get_source_segment(code, node)
        last.value = None
        module = ast.fix_missing_locations(ast.Module(body=_reports([node]), type_ignores=[]))
        try:
            exec(compile(module, "<code action>", "exec"), ns)
        except (_FinalAnswer, _CallOut):
            raise
        except BaseException as e:  # SystemExit and KeyboardInterrupt included: the model's code ended badly
            raise _Failed(f"Code execution failed at line '{segment}' due to: {type(e).__name__}: {e}")
        result = last.value
    return result


class _Failed(Exception):
    pass


def _codeact_run(payload_b64: str) -> None:
    payload = json.loads(base64.b64decode(payload_b64))
    os.makedirs(_STATE, exist_ok=True)
    result_path = os.path.join(_STATE, "result.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module  # pickle finds the model's classes and functions by `__main__.<name>`
    ns = module.__dict__
    ns["__builtins__"] = builtins
    restore_notes = []
    defs_path = os.path.join(_STATE, "defs.py")
    if os.path.exists(defs_path):
        with open(defs_path) as f:
            for block in f.read().split("\n#--codeact-block--\n"):
                try:
                    exec(compile(block, "<earlier definitions>", "exec"), ns)
                except BaseException as exc:  # a definition that no longer runs is the model's to see
                    restore_notes.append(f"re-running an earlier definition failed: {type(exc).__name__}: {exc}")
    values_path = os.path.join(_STATE, "values.pkl")
    modules, values = {}, {}
    if os.path.exists(values_path):
        try:  # the model's code can rewrite this file: what it holds is the model's to lose, never the run's
            with open(values_path, "rb") as f:
                modules, values = pickle.load(f)
            if not isinstance(modules, dict) or not isinstance(values, dict):
                raise TypeError("not the saved state")
        except BaseException as exc:
            modules, values = {}, {}
            restore_notes.append(f"the saved variables could not be loaded ({type(exc).__name__}); they are lost")
    for name, module_name in modules.items():
        try:
            ns[name] = importlib.import_module(module_name)
        except BaseException:
            restore_notes.append(f"module {module_name} could not be imported again")
    for name, blob in values.items():
        try:
            ns[name] = pickle.loads(blob)
        except BaseException as exc:
            restore_notes.append(f"variable {name} could not be restored: {type(exc).__name__}")

    for name, blob in payload.get("variables", {}).items():  # additional_args, pickled by the host
        try:
            ns[name] = pickle.loads(base64.b64decode(blob))
        except BaseException as exc:
            restore_notes.append(
                f"additional argument {name} could not be loaded in the sandbox: {type(exc).__name__}: {exc}"
            )

    answers = payload["answers"]
    calls = []

    def final_answer(answer=None):
        raise _FinalAnswer(answer)

    def make_stub(tool):
        def stub(*args, **kwargs):
            request = {"tool": tool, "args": _jsonable(list(args)), "kwargs": _jsonable(kwargs)}
            index = len(calls)
            calls.append(request)
            if index < len(answers) and answers[index]["request"] == request:
                return answers[index]["answer"]
            raise _CallOut()

        stub.__name__ = tool
        return stub

    tools = {"final_answer": final_answer, "print": _print, _RECORD: None}
    for tool in payload["host_tools"]:
        tools[tool] = make_stub(tool)
    ns.update({k: v for k, v in tools.items() if v is not None})
    for note in restore_notes:
        print(f"[note] {note}")

    outcome = {"status": "ok", "output": None}
    code = payload["code"]
    try:
        value = _run_statements(code, ns)
        outcome["output"] = None if value is None else str(value)[:50000]
    except _FinalAnswer as done:
        outcome = {"status": "final", "output": _jsonable(done.args[0] if done.args else None)}
    except _CallOut:
        outcome = {"status": "callout", "request": calls[-1]}
    except _Failed as failed:
        outcome = {"status": "error", "error": str(failed)[:20000]}
    except BaseException as exc:  # str() of the model's value raised
        outcome = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:20000]}
    sys.stdout.flush()
    if outcome["status"] != "callout":  # a call-out runs the action again from the state before it
        _save(ns, code, tools, outcome)
    with open(result_path, "w") as f:
        json.dump(outcome, f)


def _save(ns, code, tools, outcome) -> None:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        tree = None
    if tree is not None:
        kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        blocks = [ast.get_source_segment(code, node) for node in tree.body if isinstance(node, kinds)]
        blocks = [b for b in blocks if b]
        if blocks:
            with open(os.path.join(_STATE, "defs.py"), "a") as f:
                for block in blocks:
                    f.write(block + "\n#--codeact-block--\n")
    modules, values, dropped = {}, {}, []
    for name, value in list(ns.items()):
        if name.startswith("__") or name in tools:
            continue
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        if getattr(value, "__module__", None) == "__main__" and isinstance(value, (type, types.FunctionType)):
            continue  # defined again from defs.py
        try:
            values[name] = pickle.dumps(value)
        except BaseException:
            dropped.append(name)
    with open(os.path.join(_STATE, "values.pkl"), "wb") as f:
        pickle.dump((modules, values), f)
    if dropped:
        outcome["dropped"] = sorted(dropped)
