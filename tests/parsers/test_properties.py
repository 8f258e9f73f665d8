"""Property tests: random tool calls written in each family's format parse back equal."""

from __future__ import annotations

import keyword
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from environments.tool_call_parsers import get_parser

from ._conformance import calls_of
from environments.tool_call_parsers.testing import LAYOUTS

# Deterministic and no example database in the shared checkout.
SETTINGS = settings(
    max_examples=20,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

identifiers = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from("abcxyz_"),
    st.text("abcdefxyz_0129", max_size=8),
).filter(lambda s: not keyword.iskeyword(s))
# Any text without surrogates; XML families additionally must not meet their own closing tags,
# which random text practically never produces (asserted, not filtered, below).
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=16)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=6,
)
arguments = st.dictionaries(identifiers, json_values, max_size=4)
calls = st.lists(st.tuples(identifiers, arguments), min_size=1, max_size=3)
prose = st.text(st.sampled_from("abcdefghij KLMNOP.,!?'-\u00e9\u65e5"), max_size=30)


def schema_of(value: Any) -> dict[str, Any]:
    if value is None:
        return {"type": "null"}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    return {"type": "object" if isinstance(value, dict) else "array"}


def tools_for(call_list) -> list[dict[str, Any]]:
    """The schema a server would pass for these calls (needed by the text-valued XML families)."""
    tools: dict[str, dict[str, Any]] = {}
    for name, args in call_list:
        props = tools.setdefault(name, {})
        for key, value in args.items():
            props[key] = schema_of(value)
    return [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": p}}}
        for n, p in tools.items()
    ]


def consistent(call_list) -> bool:
    """One schema per (tool, key): the same key in two calls to one tool must share a type."""
    seen: dict[tuple[str, str], str] = {}
    for name, args in call_list:
        for key, value in args.items():
            t = schema_of(value)["type"]
            if seen.setdefault((name, key), t) != t:
                return False
    return True


FAMILIES = sorted(LAYOUTS)


@pytest.mark.parametrize("family", FAMILIES)
def test_random_calls_round_trip(family):
    name, write = LAYOUTS[family]

    @SETTINGS
    @given(calls.filter(consistent), prose)
    def check(call_list, before):
        if family == "qwen3_coder":
            # The format cannot carry a string value that starts or ends with the newline the
            # template wraps around values, nor the closing tag; skip such examples.
            for _, args in call_list:
                for v in args.values():
                    if isinstance(v, str) and ("</parameter>" in v or v.startswith("\n") or v.endswith("\n")):
                        return
        text = (before + "\n" if before.strip() else "") + write(call_list)
        result = get_parser(name, tools=tools_for(call_list)).parse_detailed(text)
        assert result.errors == [], text
        assert calls_of(result.tool_calls) == call_list, text
        expected = before.strip() or None
        assert result.content == expected, text

    check()
