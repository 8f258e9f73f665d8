"""Calls framed by special tokens: a section of calls, each call a header and a JSON body.

DeepSeek V3 / V3.1 and Kimi K2 differ only in their token strings and in what the header
holds (see `TokenCallSpec.layout`), so those families are data for this one engine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Literal, Mapping

from ._core import (
    _SCAN,
    NAME_PATTERN,
    ParseIssue,
    ParseResult,
    ToolCallParser,
    arguments_object,
    decode_json_stripped,
    decode_json_text,
    issue,
    join_content,
    make_call,
    strip_code_fence,
    match_name,
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


# A token's kind is the number of its group in the scanner, so a match's `lastindex` names it.
_BEGIN, _END, _CALL, _CALL_END = range(1, 5)


@lru_cache(maxsize=None)
def _scanner(spec: TokenCallSpec) -> re.Pattern[str]:
    """One pattern for every token of the family: their shared prefix, then one group per kind.

    One scan finds the same tokens as searching each on its own, because no token contains
    another and none ends with the start of another (checked here); for the same reason at
    most one alternative can match at a position, so their order does not matter.
    """
    groups = (spec.section_begin, spec.section_end, (spec.call_begin,), (spec.call_end,))
    tokens = [t for group in groups for t in group]
    for a in tokens:
        for b in tokens:
            if a != b and (a in b or any(a.endswith(b[:k]) for k in range(1, min(len(a), len(b))))):
                raise ValueError(f"tool-call tokens {a!r} and {b!r} overlap; they cannot be scanned in one pass")
    prefix = os.path.commonprefix(tokens)
    if not prefix:
        raise ValueError(f"tool-call tokens {sorted(tokens)} share no first character")
    # A literal prefix lets the regex engine skip to candidates as fast as str.find does.
    rests = "|".join("(" + "|".join(re.escape(t[len(prefix) :]) for t in group) + ")" for group in groups)
    return re.compile(f"{re.escape(prefix)}(?:{rests})")


@lru_cache(maxsize=None)
def _usual_calls(spec: TokenCallSpec) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """Calls as the family's template writes them, for reading a section in one pass: the section's
    start and its first call up to the JSON arguments; then, from the end of each call's arguments,
    the next call up to its arguments or the section's end (group `name` unset)."""
    alt = "|".join
    begin, sep, end = re.escape(spec.call_begin), re.escape(spec.sep), re.escape(spec.call_end)
    if spec.layout == "name_args":
        head, tail = f"{begin}(?P<name>{NAME_PATTERN}){sep}", end
    elif spec.layout == "id_args":  # the id's name part: a valid name without the colon that ends the id
        head, tail = f"{begin}(?P<id>functions\\.(?P<name>[A-Za-z0-9_][A-Za-z0-9_./\\-]{{0,127}}):[0-9]+){sep}", end
    else:  # the type written before the separator is always `function` in the template
        head, tail = f"{begin}function{sep}(?P<name>{NAME_PATTERN})\n```json\n", f"\n```{end}"
    head += "(?={)"
    section_begin, section_end = alt(map(re.escape, spec.section_begin)), alt(map(re.escape, spec.section_end))
    # Between calls the generic path drops whitespace; templates write none or one newline.
    return re.compile(f"(?:{section_begin}){head}"), re.compile(f"{tail}\n?(?:{head}|(?:{section_end}))")


def _tokens(text: str, scanner: re.Pattern[str]) -> list[tuple[int, int, int]]:
    """(start, end, kind) of every family token in the text, in order; linear however broken it is."""
    return [(m.start(), m.end(), m.lastindex) for m in scanner.finditer(text)]  # type: ignore[misc]  # lastindex is set: every alternative is in a group


class TokenCallParser(ToolCallParser):
    spec: TokenCallSpec

    def __init__(self, tools: Iterable[Mapping[str, Any]] | None = None) -> None:
        super().__init__(tools)
        spec = self.spec
        self._scan = _scanner(spec)  # once: hashing the spec for the cache on every parse cost 5%
        first, following = _usual_calls(spec)
        prefix = os.path.commonprefix([*spec.section_begin, *spec.section_end, spec.call_begin, spec.call_end])
        self._usual_parts = (prefix, first.match, following.match, spec.layout == "id_args")

    @property
    def stream_markers(self) -> tuple[str, ...]:  # type: ignore[override]  # per instance: built from its spec
        return (*self.spec.section_begin, self.spec.call_begin)

    def _parse(self, text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ParseResult:
        # Read in one pass when the text is as templates write it: no tokens, or one section of
        # calls whose arguments are JSON objects. Anything else is left to the general path.
        prefix, first, following, with_id = self._usual_parts
        s = text.find(prefix)
        if s == -1:
            return ParseResult(text.strip() or None)
        m = first(text, s)
        calls = []
        while m is not None:
            at = m.end()
            try:
                value, stop = _SCAN(text, at)
            except (StopIteration, ValueError):
                break
            # A token inside the arguments (quoted in a string) ends the call early on the general path.
            if type(value) is not dict or text.find(prefix, at, stop) != -1:
                break
            calls.append(make_call(m["name"], value, m["id"] if with_id else None, encoded=text[at:stop]))
            m = following(text, stop)
            if m is not None and m["name"] is None:  # the section's end
                if text.find(prefix, m.end()) != -1:
                    break
                return ParseResult(join_content((text[:s], text[m.end() :])), calls)
        return self._general(text)

    def _general(self, text: str) -> ParseResult:
        """Any text: sections and calls found by their tokens, whatever is missing or broken."""
        toks = _tokens(text, self._scan)
        n = len(toks)
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        copied = i = 0
        while True:
            # A section starts at a section token or, when that is missing, at its first call.
            while i < n and toks[i][2] not in (_BEGIN, _CALL):
                i += 1
            if i == n:
                break
            s, after, kind = toks[i]
            pieces.append(text[copied:s])
            first = i + 1 if kind == _BEGIN else i
            body_start = after if kind == _BEGIN else s
            # It ends at its end token, else at the next section or the end of the text.
            k = first
            while k < n and toks[k][2] not in (_END, _BEGIN):
                k += 1
            if k == n:
                body_end = section_end = len(text)
                i = n
            elif toks[k][2] == _END:
                body_end, section_end = toks[k][0], toks[k][1]
                i = k + 1
            else:
                body_end = section_end = toks[k][0]
                i = k
            self._section(text, body_start, body_end, toks, first, k, calls, errors, pieces)
            copied = section_end
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)

    def _section(self, text, start, end, toks, idx, stop, calls, errors, pieces) -> None:
        """The calls in text[start:end]; toks[idx:stop] are the call tokens inside it."""
        pos = start
        while pos < end:
            while idx < stop and toks[idx][2] != _CALL:
                idx += 1  # a stray call-end token: part of the text between calls
            c = toks[idx][0] if idx < stop else end
            if text[pos:c].strip():
                errors.append(issue(text, pos, c, "text between tool calls"))
                pieces.append(text[pos:c])
            if c == end:
                return
            head = toks[idx][1]
            idx += 1
            if idx == stop:  # the call's end token is missing: it runs to the end of the section
                body_end = call_end = end
            elif toks[idx][2] == _CALL_END:
                body_end, call_end = toks[idx][0], toks[idx][1]
                idx += 1
            else:  # the next call begins before this one ended
                body_end = call_end = toks[idx][0]
            parsed = self._call(text, head, body_end)
            if isinstance(parsed, str):
                errors.append(issue(text, c, call_end, parsed))
                pieces.append(text[c:call_end])
            else:
                name, args, call_id, written = parsed
                calls.append(make_call(name, args, call_id, encoded=written))
            pos = call_end

    def _call(self, text: str, start: int, end: int) -> tuple[str, dict[str, Any], str | None, str | None] | str:
        """The call in text[start:end]: (name, arguments, call id, the arguments' JSON text when
        usable as is), or why it is not a call. Read in place: the arguments are copied once."""
        spec = self.spec
        at = text.find(spec.sep, start, end)
        if at == -1:
            return f"tool call without {spec.sep}"
        rest = at + len(spec.sep)
        call_id = None
        fenced = spec.layout == "type_name_fenced"
        if fenced:
            newline = text.find("\n", rest, end)
            if newline == -1:
                name, raw = text[rest:end], ""
            else:
                name, raw = text[rest:newline], strip_code_fence(text[newline + 1 : end])
                if raw.startswith("```"):  # as before: a fence inside the fence is stripped too
                    raw = strip_code_fence(raw)
        else:
            name, raw = text[start:at], text[rest:end]
            if spec.layout == "id_args":
                call_id = name.strip()
                name = _name_from_id(call_id)
        name = name.strip()
        if match_name(name) is None:
            return f"invalid function name {name[:40]!r}"
        # raw of the fenced layout is stripped already; strip_code_fence of it would return it as is
        value, json_text, reason = (decode_json_stripped if fenced else decode_json_text)(raw)
        if reason is not None:
            return reason
        if type(value) is dict:
            return name, value, call_id, json_text
        args = arguments_object(value)
        if isinstance(args, str):
            return args
        return name, args, call_id, None


_KIMI_ID = re.compile(r"functions\.([^:]+):\d+")


def _name_from_id(call_id: str) -> str:
    """Kimi ids are `functions.NAME:INDEX`; "" when the header is not one."""
    m = _KIMI_ID.fullmatch(call_id)
    return m.group(1) if m else ""
