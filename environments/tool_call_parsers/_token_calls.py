"""Calls framed by special tokens: a section of calls, each call a header and a JSON body.

DeepSeek V3 / V3.1 and Kimi K2 differ only in their token strings and in what the header
holds (see `TokenCallSpec.layout`), so those families are data for this one engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from ._core import (
    Finder,
    ParseIssue,
    ParseResult,
    ToolCallParser,
    arguments_object,
    decode_json_exact,
    issue,
    join_content,
    make_call,
    strip_code_fence,
    valid_name,
)

__all__ = ["TokenCallSpec", "TokenCallParser"]



@dataclass(frozen=True)
class TokenCallSpec:
    section_begin: tuple[str, ...]
    section_end: tuple[str, ...]
    call_begin: str
    call_end: str
    sep: str
    # name_args:        NAME <sep> {json}                               (DeepSeek V3.1)
    # type_name_fenced: function <sep> NAME \n ```json\n{json}\n```      (DeepSeek V3)
    # id_args:          functions.NAME:IDX <sep> {json}  (the header is the call id; Kimi K2)
    layout: Literal["name_args", "type_name_fenced", "id_args"]


class _AnyOf:
    """The first of several tokens at or after a position (each token searched once, forward)."""

    def __init__(self, text: str, tokens: tuple[str, ...]) -> None:
        self._finders = [(Finder(text, tok), len(tok)) for tok in tokens]

    def find(self, start: int, stop: int | None = None) -> tuple[int, int]:
        """(position, token length) of the first hit in [start, stop), or (-1, 0)."""
        best, length = -1, 0
        for finder, n in self._finders:
            p = finder.find(start)
            if p != -1 and (stop is None or p + n <= stop) and (best == -1 or p < best):
                best, length = p, n
        return best, length


class TokenCallParser(ToolCallParser):
    spec: TokenCallSpec

    @property
    def stream_markers(self) -> tuple[str, ...]:  # type: ignore[override]
        return (*self.spec.section_begin, self.spec.call_begin)

    def _parse(self, text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ParseResult:
        spec = self.spec
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        copied = 0
        tokens = {
            "begin": _AnyOf(text, spec.section_begin),
            "end": _AnyOf(text, spec.section_end),
            "call": _AnyOf(text, (spec.call_begin,)),
            "call_end": _AnyOf(text, (spec.call_end,)),
        }
        while True:
            s, slen = tokens["begin"].find(copied)
            c, _ = tokens["call"].find(copied)
            if c != -1 and (s == -1 or c < s):
                s, slen = c, 0  # the section token is missing: the section starts at its first call
            if s == -1:
                break
            pieces.append(text[copied:s])
            body_start = s + slen
            e, elen = tokens["end"].find(body_start)
            nxt, _ = tokens["begin"].find(body_start)
            if e != -1 and (nxt == -1 or e < nxt):
                body_end, section_end = e, e + elen
            else:  # section end missing: up to the next section or the end of the text
                body_end = section_end = nxt if nxt != -1 else len(text)
            self._section(text, body_start, body_end, tokens, calls, errors, pieces)
            copied = section_end
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)

    def _section(self, text, start, end, tokens, calls, errors, pieces) -> None:
        spec = self.spec
        pos = start
        while pos < end:
            c, _ = tokens["call"].find(pos, end)
            if c == -1:
                c = end
            if text[pos:c].strip():
                errors.append(issue(text, pos, c, "text between tool calls"))
                pieces.append(text[pos:c])
            if c == end:
                return
            head = c + len(spec.call_begin)
            ce, _ = tokens["call_end"].find(head, end)
            nxt, _ = tokens["call"].find(head, end)
            if ce != -1 and (nxt == -1 or ce < nxt):
                body_end, call_end = ce, ce + len(spec.call_end)
            else:
                body_end = call_end = nxt if nxt != -1 else end
            parsed = self._call(text[head:body_end])
            if isinstance(parsed, str):
                errors.append(issue(text, c, call_end, parsed))
                pieces.append(text[c:call_end])
            else:
                name, args, call_id = parsed
                calls.append(make_call(name, args, call_id))
            pos = call_end

    def _call(self, body: str) -> tuple[str, dict[str, Any], str | None] | str:
        spec = self.spec
        header, sep, rest = body.partition(spec.sep)
        if not sep:
            return f"tool call without {spec.sep}"
        call_id = None
        if spec.layout == "type_name_fenced":
            name, _, raw = rest.partition("\n")
            raw = strip_code_fence(raw)
        else:
            name, raw = header, rest
            if spec.layout == "id_args":
                call_id = header.strip()
                name = _name_from_id(call_id)
        name = name.strip()
        if not valid_name(name):
            return f"invalid function name {name[:40]!r}"
        value, reason = decode_json_exact(raw)
        if reason is not None:
            return reason
        args = arguments_object(value)
        if isinstance(args, str):
            return args
        return name, args, call_id


_KIMI_ID = re.compile(r"functions\.([^:]+):\d+")


def _name_from_id(call_id: str) -> str:
    """Kimi ids are `functions.NAME:INDEX`; "" when the header is not one."""
    m = _KIMI_ID.fullmatch(call_id)
    return m.group(1) if m else ""
