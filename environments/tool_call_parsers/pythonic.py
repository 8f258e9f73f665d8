"""Pythonic calls (Llama 3.2 / Llama 4 pythonic, Olmo, ToolACE): a Python list of calls.

    [get_weather(city='Paris', unit="celsius"), ping()]
    <|python_start|>[get_weather(city='Paris')]<|python_end|>

The list is read with `ast` (never executed): keyword arguments only, literal values
(strings, numbers, True/False/None, lists, dicts; JSON's true/false/null are accepted
too). A list starts the text, a line, or follows an announcing token.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Mapping

from ._values import parse_python
from ._core import ParseIssue, ParseResult, ToolCallParser, issue, join_content, make_call
from ._registry import register_parser

__all__ = ["PythonicParser"]

_START = re.compile(r"(?m)(?:^|<\|python_start\|>|<\|python_tag\|>)[ \t]*(?=\[)")
_LOOKS_LIKE_CALLS = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_CLOSERS = ("<|python_end|>",)
_JSON_NAMES = {"true": True, "false": False, "null": None}
_MAX_LIST = 100_000  # ast on megabytes of junk is slow and pointless


class _NotACall(Exception):
    pass


@register_parser("pythonic", "llama4_pythonic")
class PythonicParser(ToolCallParser):
    stream_markers = ("[", "<|python_start|>", "<|python_tag|>")

    def _parse(self, text: str, schemas: Mapping[str, Any]) -> ParseResult:
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        copied = 0
        for m in _START.finditer(text):
            if m.start() < copied:
                continue
            j = m.end()
            if not _LOOKS_LIKE_CALLS.match(text, j):
                continue  # an ordinary list in the answer
            stop = _matching_bracket(text, j)
            if stop == -1:
                errors.append(issue(text, m.start(), len(text), "unterminated list of calls"))
                continue
            try:
                parsed = _calls(text[j:stop])
            except _NotACall as exc:
                errors.append(issue(text, m.start(), stop, str(exc)))
                continue
            pieces.append(text[copied : m.start()])
            calls.extend(make_call(n, a) for n, a in parsed)
            copied = stop
            rest = text[stop:].lstrip(" \t")
            for tok in _CLOSERS:
                if rest.startswith(tok):
                    copied = len(text) - len(rest) + len(tok)
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)


# Brackets and string literals (which may hold brackets); the scanner jumps over whole strings.
_LEXEME = re.compile(
    "|".join(
        (
            r"'''(?:[^\\]|\\.)*?'''",
            r'"""(?:[^\\]|\\.)*?"""',
            r"'(?:[^'\\\n]|\\.)*'",
            r'"(?:[^"\\\n]|\\.)*"',
            r"[\[\](){}]",
        )
    ),
    re.DOTALL,
)


def _matching_bracket(text: str, j: int) -> int:
    """Index after the `]` closing the `[` at j (string literals respected), or -1."""
    depth = 0
    for m in _LEXEME.finditer(text, j, min(len(text), j + _MAX_LIST)):
        ch = m.group()
        if ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
            if depth == 0:
                return m.end()
    return -1


def _calls(source: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise _NotACall(f"not a valid Python list of calls: {type(exc).__name__}") from None
    if not isinstance(tree, ast.Expression) or not isinstance(tree.body, ast.List):
        raise _NotACall("not a list of calls")
    out = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call):
            raise _NotACall("list item is not a call")
        name = _dotted(node.func)
        if node.args:
            raise _NotACall(f"{name}() has positional arguments; only keyword arguments map to a JSON object")
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise _NotACall(f"{name}() uses **kwargs")
            args[kw.arg] = _literal(kw.value)
        out.append((name, args))
    return out


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise _NotACall("call target is not a name")


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(x) for x in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise _NotACall("dict unpacking in an argument")
            key = _literal(k)
            if not isinstance(key, str):
                raise _NotACall("dict keys must be strings to be JSON")
            out[key] = _literal(v)
        return out
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise _NotACall(f"argument value is not a literal: {ast.dump(node)[:40]}") from None
    if isinstance(value, tuple):
        return [_literal(x) for x in node.elts] if isinstance(node, ast.Tuple) else list(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
            raise _NotACall("NaN/Infinity are not JSON")
        return value
    raise _NotACall(f"argument value of type {type(value).__name__} is not JSON")
