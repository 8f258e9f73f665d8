"""JSON objects between tags: Hermes 2 Pro/3/4, Qwen2.5/Qwen3 (hermes format), SmolLM.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Leniency for what real models write: a missing closing tag (at the end of the text or
before the next opening tag), a code-fenced body, a missing opening tag right before a
valid body (`{...}</tool_call>`), `parameters` instead of `arguments`, arguments encoded
twice as a JSON string, a list of calls inside one block, and a Python dict literal
(single quotes, True/None) instead of JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ._values import python_literal
from ._core import (
    JSON_DECODER,
    DecodeBudget,
    ParseIssue,
    ParseResult,
    TagBlocks,
    ToolCallParser,
    call_from_object,
    issue,
    join_content,
    make_call,
    strip_code_fence,
    usual_call_object,
)
from ._registry import register_parser

__all__ = ["JsonTagSpec", "JsonTagParser", "HermesParser", "HERMES"]

# Bounds the search for a body whose opening tag is missing (keeps fuzzed input linear).
_MAX_ORPHAN_CANDIDATES = 64


@dataclass(frozen=True)
class JsonTagSpec:
    start: str
    end: str
    name_keys: tuple[str, ...] = ("name",)
    arg_keys: tuple[str, ...] = ("arguments", "parameters")


HERMES = JsonTagSpec(start="<tool_call>", end="</tool_call>")

_SPACE = re.compile(r"\s*")  # between a call object and its closing tag: what str.strip() skips


def calls_in_json(body: str, spec: JsonTagSpec) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
    """Every call in a block body: one object, a list of objects, or objects one after another."""
    s = strip_code_fence(body)
    if not s:
        return [], "empty tool call body"
    values: list[Any] = []
    pos = 0
    while pos < len(s):
        try:
            value, pos = JSON_DECODER.raw_decode(s, pos)
        except json.JSONDecodeError as exc:
            # Small models imitate Python reprs: {'name': 'f', 'arguments': {'x': True}}.
            literal = python_literal(s) if pos == 0 else None
            if literal is None:
                return [], f"invalid JSON: {exc.msg} at position {exc.pos}"
            value, pos = literal, len(s)
        values.extend(value if isinstance(value, list) else [value])
        while pos < len(s) and s[pos] in " \t\r\n,;":
            pos += 1
    return calls_in_values(values, spec)


def calls_in_values(values: list[Any], spec: JsonTagSpec) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
    if not values:
        return [], "empty list of tool calls"
    out = []
    for value in values:
        call = call_from_object(value, spec.name_keys, spec.arg_keys)
        if isinstance(call, str):
            return [], call
        out.append(call)
    return out, None


class JsonTagParser(ToolCallParser):
    spec: JsonTagSpec = HERMES

    @property
    def stream_markers(self) -> tuple[str, ...]:  # type: ignore[override]  # per instance: built from its spec
        # `{`/`[`: a body whose opening tag is missing starts there.
        return (self.spec.start, self.spec.end, "{", "[")

    def _parse(self, text: str, schemas: Mapping[str, Any]) -> ParseResult:
        spec = self.spec
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        copied = 0  # text[:copied] is already in `pieces` or consumed as a call
        i = 0
        budget = DecodeBudget()
        blocks = TagBlocks(text, spec.start, spec.end)
        while True:
            s = blocks.opens.find(i)
            e = blocks.closes.find(i)
            if e != -1 and (s == -1 or e < s):
                # A closing tag with no opening tag: a body right before it still counts.
                # Only text after the previous tag can be its body (keeps the search linear).
                found = self._orphan_body(text, i, e)
                if found is None:
                    errors.append(issue(text, e, e + len(spec.end), f"{spec.end} without a tool call before it"))
                else:
                    body_start, parsed = found
                    pieces.append(text[copied:body_start])
                    calls.extend(make_call(n, a) for n, a in parsed)
                    copied = e + len(spec.end)
                i = e + len(spec.end)
                continue
            if s == -1:
                break
            body_start = s + len(spec.start)
            usual = None if budget.exhausted else self._usual_body(text, body_start)
            if usual is not None:
                name, arguments, encoded, block_end = usual
                pieces.append(text[copied:s])
                calls.append(make_call(name, arguments, encoded=encoded))
                copied = i = block_end
                continue
            found = None if budget.exhausted else self._plain_body(text, body_start, budget, blocks)
            if found is not None:
                # One JSON value right after the tag (the usual case): decoded once, and a
                # closing tag quoted inside an argument string cannot end the block early.
                body_end, value = found
                block_end = body_end + len(spec.end) if text.startswith(spec.end, body_end) else body_end
                parsed, reason = calls_in_values(value if isinstance(value, list) else [value], spec)
            else:
                body_end, block_end = blocks.extent(body_start)
                parsed, reason = calls_in_json(text[body_start:body_end], spec)
            if reason is None:
                pieces.append(text[copied:s])
                calls.extend(make_call(n, a) for n, a in parsed)
                copied = block_end
            else:
                errors.append(issue(text, s, block_end, reason))
            i = block_end
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)

    def _usual_body(self, text: str, body_start: int) -> tuple[str, dict[str, Any], str, int] | None:
        """(name, arguments, their text, where the block ends) for the usual body closed by its tag."""
        spec = self.spec
        if "name" not in spec.name_keys:
            return None
        usual = usual_call_object(text, body_start, spec.arg_keys)
        if usual is None:
            return None
        name, arguments, encoded, close = usual
        tag = _SPACE.match(text, close).end()  # type: ignore[union-attr]  # `*` always matches
        if not text.startswith(spec.end, tag):
            return None
        return name, arguments, encoded, tag + len(spec.end)

    def _plain_body(
        self, text: str, body_start: int, budget: DecodeBudget, blocks: TagBlocks
    ) -> tuple[int, Any] | None:
        """(where the body ends, its value) when the body is exactly one JSON value, else None."""
        j = body_start
        while j < len(text) and text[j] in " \t\r\n":
            j += 1
        if j >= len(text) or text[j] not in "{[":
            return None
        try:
            value, stop = budget.decode(text, j)
        except ValueError:
            return None
        found = [p for p in (blocks.closes.find(stop), blocks.opens.find(stop)) if p != -1]
        boundary = min(found) if found else len(text)
        return (boundary, value) if not text[stop:boundary].strip() else None

    def _orphan_body(self, text: str, lo: int, end_tag: int) -> tuple[int, list[tuple[str, dict[str, Any]]]] | None:
        segment = text[lo:end_tag].rstrip()
        if not segment.endswith(("}", "]")):
            return None
        tried = 0
        j = lo - 1
        while tried < _MAX_ORPHAN_CANDIDATES:
            j = _next_open(text, j + 1, lo + len(segment))
            if j == -1:
                return None
            tried += 1
            try:
                _, stop = JSON_DECODER.raw_decode(segment, j - lo)
            except ValueError:
                continue
            if stop != len(segment):
                continue
            parsed, reason = calls_in_json(segment[j - lo :], self.spec)
            if reason is None:
                return j, parsed
        return None


def _next_open(text: str, start: int, stop: int) -> int:
    a = text.find("{", start, stop)
    b = text.find("[", start, stop)
    if a == -1:
        return b
    if b == -1:
        return a
    return min(a, b)


@register_parser("hermes", "qwen", "qwen25")
class HermesParser(JsonTagParser):
    spec = HERMES
