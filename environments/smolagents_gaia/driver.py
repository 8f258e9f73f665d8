"""The program that runs one code action inside the slot (stdlib only; it never runs in our process).

The executor sends this file's source on the interpreter's stdin, followed by one call of
`_codeact_run(<payload>)`. The payload (base64 JSON) holds the code action, the answers to
host call-outs made so far in this action, and the names of the tools to define; never a key
or a host path. State between actions lives in the slot's workspace under `.codeact/`:
the definitions (imports, functions, classes) of earlier actions are run again, and every
other global that pickles is restored, so the model's objects never leave the slot.

Outcome (written to `.codeact/result.json`, read back by the executor):
`ok` (with the repr of a last expression), `final` (the value given to `final_answer`),
`error` (the traceback's last lines), or `callout` (a host tool was called whose answer is not
in the payload yet: the executor answers it and runs the action again from the saved state).
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
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


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
    if os.path.exists(values_path):
        with open(values_path, "rb") as f:
            modules, values = pickle.load(f)
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

    tools = {"final_answer": final_answer}
    for tool in payload["host_tools"]:
        tools[tool] = make_stub(tool)
    ns.update(tools)
    for note in restore_notes:
        print(f"[note] {note}")

    outcome = {"status": "ok", "output": None}
    code = payload["code"]
    try:
        tree = ast.parse(code, "<code action>")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<code action>", "exec"), ns)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<code action>", "eval"), ns)
            outcome["output"] = None if value is None else repr(value)[:10000]
    except _FinalAnswer as done:
        outcome = {"status": "final", "output": _jsonable(done.args[0] if done.args else None)}
    except _CallOut:
        outcome = {"status": "callout", "request": calls[-1]}
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the model's code ended badly
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        kept = [line for line in lines if "<code action>" in line or not line.startswith("  File")]
        outcome = {"status": "error", "error": "".join(kept[-8:])[-4000:]}
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
