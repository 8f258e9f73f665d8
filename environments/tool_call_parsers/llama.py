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
from typing import Any, Iterable, Mapping

from ._core import (
    DecodeBudget,
    ParseIssue,
    ParseResult,
    ToolCallParser,
    call_from_object,
    issue,
    join_content,
    make_call,
    usual_call_object,
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

    def __init__(self, tools: Iterable[Mapping[str, Any]] | None = None) -> None:
        super().__init__(tools)
        closers = "|".join(map(re.escape, (*self.spec.closers, "```")))
        # The markup after a call: a closing token or fence, else a `;` (whitespace before either).
        self._trail = re.compile(f"[ \\t\\r\\n]*(?:{closers}|;)").match
        # The call object as templates write it, read in one pass (None: this spec names other keys).
        self._usual = usual_call_object if "name" in self.spec.name_keys else None

    def _parse(self, text: str, schemas: Mapping[str, Any]) -> ParseResult:
        spec = self.spec
        usual_object, trail = self._usual, self._trail
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
            usual = None if usual_object is None else usual_object(text, j, spec.arg_keys)
            if usual is not None:
                name, arguments, encoded, stop = usual
                pieces.append(text[copied:start])
                calls.append(make_call(name, arguments, encoded=encoded))
                end = trail(text, stop)
                copied = stop if end is None else end.end()
                j = text.find("{", copied)
                continue
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
            end = trail(text, stop)
            copied = stop if end is None else end.end()
            j = text.find("{", copied)
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)

    def _lead(self, text: str, lo: int, j: int) -> tuple[int, bool] | None:
        """Where the markup before the object at `j` starts, and whether a token announced it."""
        k = j
        while k > lo and text[k - 1] in " \t":
            k -= 1
        announce = self.spec.announce
        if text.endswith(announce, lo, k):
            for tok in announce:
                if text.endswith(tok, lo, k):
                    return k - len(tok), True
        fence = _FENCE_OPEN.search(text, max(lo, j - 16), j) if text.find("```", max(lo, j - 16), j) != -1 else None
        if fence:
            return fence.start(), False
        if k == lo or text[k - 1] == "\n":
            return k, False
        return None


@register_parser("llama3_json", "llama3")
class Llama3JsonParser(BareJsonParser):
    spec = LLAMA3_JSON


@register_parser("llama4_json")
class Llama4JsonParser(BareJsonParser):
    spec = LLAMA4_JSON
