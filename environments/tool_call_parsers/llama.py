"""Llama 3.1/3.2/3.3 and Llama 4 JSON calls: bare JSON objects, optionally announced.

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {}}
    <|python_start|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|python_end|>

An object counts as a call when it starts a line, follows an announcing token or a
previous call (`;`-separated), or sits in a code fence, and has a name plus
`parameters`/`arguments`; JSON in the middle of prose is left alone. After an announcing
token, JSON that does not decode is reported.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

from ._core import (
    DecodeBudget,
    ParseIssue,
    ParseResult,
    ToolCallParser,
    call_from_object,
    issue,
    join_content,
    make_call,
)
from ._registry import register_parser

__all__ = ["BareJsonSpec", "Llama3JsonParser", "Llama4JsonParser", "LLAMA3_JSON", "LLAMA4_JSON"]


@dataclass(frozen=True)
class BareJsonSpec:
    announce: tuple[str, ...]  # tokens written right before calls
    closers: tuple[str, ...]  # tokens written right after calls (removed with them)
    name_keys: tuple[str, ...] = ("name",)
    arg_keys: tuple[str, ...] = ("parameters", "arguments")


LLAMA3_JSON = BareJsonSpec(announce=("<|python_tag|>",), closers=())
LLAMA4_JSON = replace(LLAMA3_JSON, announce=("<|python_start|>", "<|python_tag|>"), closers=("<|python_end|>",))

_FENCE_OPEN = re.compile(r"```(?:json)?[ \t]*\n[ \t]*$")
_LOOKS_LIKE_CALL = re.compile(r'\{\s*"(?:name|function)"\s*:')


class BareJsonParser(ToolCallParser):
    spec: BareJsonSpec = LLAMA3_JSON

    @property
    def stream_markers(self) -> tuple[str, ...]:  # type: ignore[override]  # per instance: built from its spec
        return (*self.spec.announce, "{", "```")

    def _parse(self, text: str, schemas: Mapping[str, Any]) -> ParseResult:
        spec = self.spec
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        copied = 0
        budget = DecodeBudget()
        j = text.find("{")
        while j != -1:
            lead = self._lead(text, copied, j)
            if lead is None:
                j = text.find("{", j + 1)
                continue
            start, announced = lead
            if budget.exhausted:
                errors.append(
                    issue(text, start, len(text), "too many malformed JSON objects; the rest is left as text")
                )
                break
            try:
                obj, stop = budget.decode(text, j)
            except json.JSONDecodeError as exc:
                if announced or _LOOKS_LIKE_CALL.match(text, j):
                    errors.append(issue(text, start, min(len(text), j + 200), f"invalid JSON: {exc.msg}"))
                j = text.find("{", j + 1)
                continue
            is_dict = isinstance(obj, dict)
            if not (
                announced
                or (is_dict and any(k in obj for k in spec.name_keys) and any(k in obj for k in spec.arg_keys))
            ):
                j = text.find("{", stop)  # ordinary JSON in the answer, not a call
                continue
            call = call_from_object(obj, spec.name_keys, spec.arg_keys)
            if isinstance(call, str):
                errors.append(issue(text, start, stop, call))
                j = text.find("{", stop)
                continue
            pieces.append(text[copied:start])
            calls.append(make_call(*call))
            copied = self._trail(text, stop)
            j = text.find("{", copied)
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)

    def _lead(self, text: str, lo: int, j: int) -> tuple[int, bool] | None:
        """Where the markup before the object at `j` starts, and whether a token announced it."""
        k = j
        while k > lo and text[k - 1] in " \t":
            k -= 1
        for tok in self.spec.announce:
            if text.startswith(tok, k - len(tok)) and k - len(tok) >= lo:
                return k - len(tok), True
        fence = _FENCE_OPEN.search(text, max(lo, j - 16), j)
        if fence:
            return fence.start(), False
        if k == lo or text[k - 1] == "\n":
            return k, False
        return None

    def _trail(self, text: str, stop: int) -> int:
        """The end of the markup after a call: a closing token, a closing fence, a `;`."""
        k = stop
        while k < len(text) and text[k] in " \t\r\n":
            k += 1
        for tok in self.spec.closers + ("```",):
            if text.startswith(tok, k):
                return k + len(tok)
        return k + 1 if text.startswith(";", k) else stop


@register_parser("llama3_json", "llama3")
class Llama3JsonParser(BareJsonParser):
    spec = LLAMA3_JSON


@register_parser("llama4_json")
class Llama4JsonParser(BareJsonParser):
    spec = LLAMA4_JSON
