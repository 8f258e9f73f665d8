"""Mistral calls, in every form the tokenizer versions produce:

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]   (v3)
    [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}                           (v7-v11)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]ping[ARGS]{}                     (v13, Devstral 2)
    [TOOL_CALLS]get_weather{"city": "Paris"}                                                    (Magistral / sloppy)

Call ids are Mistral's 9 alphanumeric characters (kept when the model wrote one), because
the Mistral templates refuse any other id when the conversation is rendered again.
Leniency: a JSON list of calls at the very start of the text without the `[TOOL_CALLS]`
token (servers that drop special tokens from the text).
"""

from __future__ import annotations

import json
import re
import string
from random import getrandbits
from typing import Any, Mapping

from ._core import (
    DecodeBudget,
    NAME_PATTERN,
    ParseIssue,
    ParseResult,
    ToolCallParser,
    arguments_object,
    call_from_object,
    issue,
    join_content,
    make_call,
)
from ._registry import register_parser

__all__ = ["MistralParser"]

_TOKEN = "[TOOL_CALLS]"
_NAMED = re.compile(rf"\s*({NAME_PATTERN})(?:\[CALL_ID\]\s*([A-Za-z0-9]+))?\s*(\[ARGS\])?\s*(?=\{{)")
_BARE_LIST = re.compile(r'\s*\[\s*\{\s*"name"\s*:')
_ID_ALPHABET = string.ascii_letters + string.digits
# Byte -> id character, one table lookup per character (the slight skew of 256 % 62 is harmless
# in an id that only has to differ from the others of one conversation).
_ID_TABLE = bytes((_ID_ALPHABET[b % len(_ID_ALPHABET)].encode()[0] for b in range(256)))


def mistral_call_id() -> str:
    return getrandbits(72).to_bytes(9, "big").translate(_ID_TABLE).decode("ascii")


@register_parser("mistral")
class MistralParser(ToolCallParser):
    stream_markers = (_TOKEN, "[")  # `[`: a list of calls written without the token

    def new_call_id(self) -> str:
        return mistral_call_id()

    def _parse(self, text: str, schemas: Mapping[str, Any]) -> ParseResult:
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        copied = 0
        budget = DecodeBudget()
        tokenless = _TOKEN not in text and _BARE_LIST.match(text) is not None
        s = 0 if tokenless else text.find(_TOKEN)
        while s != -1:
            pos = s if tokenless else s + len(_TOKEN)
            tokenless = False
            if budget.exhausted:
                errors.append(issue(text, s, len(text), "too many malformed calls; the rest is left as text"))
                break
            parsed, stop, reason = self._calls_at(text, pos, budget)
            if reason is not None:
                nxt = text.find(_TOKEN, pos)
                errors.append(issue(text, s, nxt if nxt != -1 else min(len(text), s + 200), reason))
                s = nxt
                continue
            pieces.append(text[copied:s])
            calls.extend(parsed)
            copied = stop
            s = text.find(_TOKEN, stop)
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)

    def _calls_at(self, text: str, pos: int, budget: DecodeBudget) -> tuple[list[dict[str, Any]], int, str | None]:
        """The calls written right after one [TOOL_CALLS] token, and where they end."""
        k = pos
        while k < len(text) and text[k] in " \t\r\n":
            k += 1
        if text.startswith(("[", "{"), k):
            try:
                value, stop = budget.decode(text, k)
            except json.JSONDecodeError as exc:
                return [], pos, f"invalid JSON after [TOOL_CALLS]: {exc.msg}"
            out = []
            for item in value if isinstance(value, list) else [value]:
                call = call_from_object(item, ("name",), ("arguments", "parameters"))
                if isinstance(call, str):
                    return [], pos, call
                given = item.get("id") if isinstance(item, dict) else None
                out.append(make_call(*call, call_id=given if isinstance(given, str) and given else mistral_call_id()))
            if not out:
                return [], pos, "empty list after [TOOL_CALLS]"
            return out, stop, None
        out = []
        while True:
            m = _NAMED.match(text, k)
            if m is None:
                if out:
                    return out, k, None
                return [], pos, "[TOOL_CALLS] not followed by a JSON list or NAME[ARGS]{...}"
            try:
                value, stop = budget.decode(text, m.end())
            except json.JSONDecodeError as exc:
                return [], pos, f"invalid JSON arguments for {m.group(1)}: {exc.msg}"
            # An object is kept as the model wrote it; anything else is normalised first.
            written = text[m.end() : stop] if type(value) is dict else None
            args = value if written is not None else arguments_object(value)
            if isinstance(args, str):
                return [], pos, args
            out.append(make_call(m.group(1), args, call_id=m.group(2) or mistral_call_id(), encoded=written))
            k = stop
            if text.startswith(_TOKEN, k):  # the usual next call, with a token of its own
                return out, k, None
            # Several calls after one token only when each carries [ARGS] (never eat prose).
            nxt = _NAMED.match(text, k)
            if nxt is None or not nxt.group(3):
                return out, k, None
