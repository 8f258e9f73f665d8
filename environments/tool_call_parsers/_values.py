"""Argument values written as text: typed parameter values (XML families) and Python literals
(pythonic calls, single-quoted JSON). Standard library only, like the rest of this package."""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from typing import Any, Mapping

from ._core import JSON_DECODER, decode_json_stripped

__all__ = ["coerce_value", "parse_python", "python_literal"]


# --- typed parameter values (XML families) -------------------------------------------

_JSON_STARTS = frozenset('{["-0123456789tfn')


def coerce_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """A parameter value written as text -> a JSON value.

    Without a schema: JSON when the text is valid JSON, else the string as written.
    With the parameter's JSON schema: convert to the declared type, falling back to the
    untyped rule when the text does not fit (the model's mistake stays visible).
    """
    if schema is not None:
        # Strings last: with ["string", "null"], `None` written by a template means null.
        for t in sorted(_declared_types(schema), key=lambda t: t == "string"):
            ok, value = _convert(raw, t)
            if ok:
                return value
    head = raw.lstrip()[:1]
    if not head or head not in _JSON_STARTS:
        return raw  # cannot be JSON; skips the cost of a failed decode for plain text
    value, _, reason = decode_json_stripped(raw.strip(" \t\n\r"))  # JSON's whitespace only, as json.loads
    return raw if reason is not None else value


def _declared_types(schema: Mapping[str, Any] | None) -> list[str]:
    if not isinstance(schema, Mapping):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    if "enum" in schema and isinstance(schema["enum"], list):
        kinds = {type(v).__name__ for v in schema["enum"]}
        return ["string"] if kinds == {"str"} else []
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            out.extend(_declared_types(sub))
    return out


def _convert(raw: str, t: str) -> tuple[bool, Any]:
    s = raw.strip()
    if t == "string":
        return True, raw
    if t == "null":
        return (True, None) if s in ("null", "None") else (False, None)
    if t == "boolean":
        low = s.lower()
        return (True, low == "true") if low in ("true", "false") else (False, None)
    if t in ("integer", "number"):
        try:
            return True, int(s)
        except ValueError:
            pass
        if t == "integer":
            return False, None
        try:
            f = float(s)
        except ValueError:
            return False, None
        return (True, f) if f == f and f not in (float("inf"), float("-inf")) else (False, None)
    if t in ("object", "array"):
        want = dict if t == "object" else list
        try:
            v = JSON_DECODER.decode(s)
        except ValueError:
            v = python_literal(s)
        return (True, v) if isinstance(v, want) else (False, None)
    return False, None


def parse_python(source: str, mode: str = "eval") -> ast.AST:
    """`ast.parse` without the warnings that invalid escapes in model text would print.

    Raises SyntaxError, ValueError, MemoryError or RecursionError like `ast.parse`, and
    SyntaxError for adjacent string literals.
    (`catch_warnings` swaps process-wide filters; parsing runs on one thread.)
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = ast.parse(source, mode=mode)
    if _MAYBE_ADJACENT.search(source) and _adjacent_strings(source):
        # `"get_" "weather"` is one string to Python; in a model's call it is damage.
        raise SyntaxError("adjacent string literals")
    return tree


# A quote, optional space, a quote: the cheap test before tokenizing (which is slow).
_MAYBE_ADJACENT = re.compile(r"""['"]\s*[rRbBuUfF]{0,2}['"]""")


def _adjacent_strings(source: str) -> bool:
    previous = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                continue
            if tok.type == tokenize.STRING and previous == tokenize.STRING:
                return True
            previous = tok.type
    except (tokenize.TokenError, SyntaxError):
        return True  # not reachable for source ast accepted; refuse rather than guess
    return False


def python_literal(s: str) -> Any:
    """A Python literal (`{'a': True, 'b': None}`) as a JSON value, or None when it is not one.

    Templates that render values with Jinja's `string` filter, and small models imitating
    them, write Python reprs. `ast.literal_eval` reads them without executing anything;
    values JSON cannot hold (sets, bytes, complex, NaN, non-string keys) are refused.
    """
    try:
        value = ast.literal_eval(parse_python(s.strip()))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    try:
        return _as_json(value)
    except ValueError:
        return None


def _as_json(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("not finite")
        return value
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _as_json(v) for k, v in value.items()}
    raise ValueError(f"{type(value).__name__} is not JSON")
