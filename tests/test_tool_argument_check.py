"""The registry's precompiled argument check agrees with jsonschema on every value it accepts.

The fast check may only say "valid"; whatever it refuses goes to jsonschema. So the property
that matters is: fast says valid => jsonschema says valid, and the registry's verdict (handler
runs or an error comes back) is jsonschema's, for values at every type boundary.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from jsonschema import validators

from tools.context import ToolContext, ToolLimits
from tools.registry import Tool, ToolRegistry, _fast_check

VALUES: list[Any] = [
    "x", "", 0, 1, -3, 1.0, 1.5, float("nan"), True, False, None, [], [1], {}, {"a": 1}, 10**30, 2.0**70,
]  # fmt: skip
TYPES = ["string", "integer", "number", "boolean"]


def flat_schemas() -> list[dict[str, Any]]:
    schemas: list[dict[str, Any]] = [{}, {"type": "object"}, {"type": "object", "description": "anything"}]
    for t in TYPES:
        for required in ([], ["a"]):
            schemas.append(
                {"type": "object", "properties": {"a": {"type": t, "description": "d"}}, "required": required}
            )
    schemas.append({"type": "object", "properties": {"a": {"description": "untyped"}, "b": {"type": "integer"}}})
    return schemas


@pytest.mark.parametrize("schema", flat_schemas())
def test_fast_check_never_accepts_what_jsonschema_rejects(schema: dict[str, Any]) -> None:
    fast = _fast_check(schema)
    assert fast is not None, "a flat typed schema gets a fast check"
    validator = validators.validator_for(schema)(schema)
    argument_sets = [{}] + [{"a": v} for v in VALUES] + [{"a": v, "b": w} for v, w in itertools.product(VALUES, VALUES)]
    for arguments in argument_sets:
        if fast(arguments):
            assert validator.is_valid(arguments), (schema, arguments)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}},
        {"type": "object", "properties": {"a": {"type": ["string", "null"]}}},
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
        {"$schema": "http://json-schema.org/draft-04/schema#", "properties": {"a": {"type": "integer"}}},
        {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}},
        {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}},
    ],
)
def test_schemas_beyond_flat_types_are_left_to_jsonschema(schema: dict[str, Any]) -> None:
    assert _fast_check(schema) is None


def test_registry_verdicts_are_jsonschemas() -> None:
    """Through `call`: the handler runs exactly when jsonschema accepts the arguments."""
    ran: list[dict[str, Any]] = []

    async def handler(args: dict[str, Any], context: Any) -> str:
        ran.append(args)
        return "ok"

    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}, "required": ["n"]}
    registry = ToolRegistry([Tool("t", "test", "a tool", schema, handler)])
    validator = validators.validator_for(schema)(schema)
    context = ToolContext(None, ToolLimits(), task_id="t")  # type: ignore[arg-type]  # the handler needs no executor
    for n, s in itertools.product(VALUES, VALUES):
        arguments = {"n": n, "s": s}
        ran.clear()
        answer = asyncio.run(registry.call("t", arguments, context, frozenset({"t"})))
        assert (answer == "ok") == validator.is_valid(arguments), (arguments, answer)
        assert bool(ran) == validator.is_valid(arguments)
    assert '"error"' in asyncio.run(registry.call("t", {"s": "x"}, context, ["t"]))  # required, a list as allowed


def test_a_registry_reusing_checked_schemas_checks_any_other_schema() -> None:
    """`checked=`: a tool whose name and schema the checked registry has gives the same verdicts through its
    own handler; a tool of that name with another schema is checked and compiled afresh."""
    ran: list[str] = []

    def handler(label: str):
        async def run(args: dict[str, Any], context: Any) -> str:
            ran.append(label)
            return label

        return run

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    checked = ToolRegistry([Tool("t", "test", "a tool", schema, handler("schemas"))])
    context = ToolContext(None, ToolLimits(), task_id="t")  # type: ignore[arg-type]  # the handler needs no executor
    bound = ToolRegistry([Tool("t", "test", "a tool", dict(schema), handler("bound"))], checked=checked)
    assert asyncio.run(bound.call("t", {"n": 1}, context)) == "bound"
    assert '"error"' in asyncio.run(bound.call("t", {"n": "1"}, context)) and ran == ["bound"]
    other = {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]}
    rebound = ToolRegistry([Tool("t", "test", "a tool", other, handler("other"))], checked=checked)
    assert asyncio.run(rebound.call("t", {"n": "1"}, context)) == "other"
    assert '"error"' in asyncio.run(rebound.call("t", {"n": 1}, context)) and ran == ["bound", "other"]
    with pytest.raises(ValueError, match="invalid parameters schema"):
        ToolRegistry([Tool("t", "test", "a tool", {"type": 7}, handler("bad"))], checked=checked)
