"""Calls framed by special tokens: a section of calls, each call a header and a JSON body.

DeepSeek V3 / V3.1 and Kimi K2 differ only in their token strings and in what the header
holds (see `TokenCallSpec.layout`), so those families are data for this one engine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Mapping

from ._core import (
    ParseIssue,
    ParseResult,
    ToolCallParser,
    arguments_object,
    decode_json_text,
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


_BEGIN, _END, _CALL, _CALL_END = range(4)


@lru_cache(maxsize=None)
def _scanner(spec: TokenCallSpec) -> tuple[str, tuple[tuple[str, int], ...]]:
    """The prefix every token of the family starts with, and the tokens (longest first) with kinds.

    Scanning for the shared prefix with `str.find` and then telling the tokens apart finds the
    same tokens as searching each on its own, because no token contains another and none ends
    with the start of another (checked here).
    """
    kinds = {t: _BEGIN for t in spec.section_begin}
    kinds.update({t: _END for t in spec.section_end})
    kinds[spec.call_begin] = _CALL
    kinds[spec.call_end] = _CALL_END
    for a in kinds:
        for b in kinds:
            if a != b and (a in b or any(a.endswith(b[:k]) for k in range(1, min(len(a), len(b))))):
                raise ValueError(f"tool-call tokens {a!r} and {b!r} overlap; they cannot be scanned in one pass")
    prefix = os.path.commonprefix(list(kinds))
    if not prefix:
        raise ValueError(f"tool-call tokens {sorted(kinds)} share no first character")
    return prefix, tuple(sorted(kinds.items(), key=lambda kv: len(kv[0]), reverse=True))


def _tokens(text: str, spec: TokenCallSpec) -> list[tuple[int, int, int]]:
    """(start, end, kind) of every family token in the text, in order; linear however broken it is."""
    prefix, table = _scanner(spec)
    out = []
    find, startswith = text.find, text.startswith
    i = find(prefix)
    while i != -1:
        for tok, kind in table:
            if startswith(tok, i):
                j = i + len(tok)
                out.append((i, j, kind))
                break
        else:
            j = i + 1
        i = find(prefix, j)
    return out


class TokenCallParser(ToolCallParser):
    spec: TokenCallSpec

    @property
    def stream_markers(self) -> tuple[str, ...]:  # type: ignore[override]  # per instance: built from its spec
        return (*self.spec.section_begin, self.spec.call_begin)

    def _parse(self, text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ParseResult:
        toks = _tokens(text, self.spec)
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
            parsed = self._call(text[head:body_end])
            if isinstance(parsed, str):
                errors.append(issue(text, c, call_end, parsed))
                pieces.append(text[c:call_end])
            else:
                name, args, call_id, written = parsed
                calls.append(make_call(name, args, call_id, encoded=written))
            pos = call_end

    def _call(self, body: str) -> tuple[str, dict[str, Any], str | None, str | None] | str:
        """(name, arguments, call id, the arguments' JSON text when usable as is), or why not a call."""
        spec = self.spec
        header, sep, rest = body.partition(spec.sep)
        if not sep:
            return f"tool call without {spec.sep}"
        call_id = None
        if spec.layout == "type_name_fenced":
            name, _, raw = rest.partition("\n")
            raw = strip_code_fence(raw)  # as before: a fence inside the fence is stripped too
        else:
            name, raw = header, rest
            if spec.layout == "id_args":
                call_id = header.strip()
                name = _name_from_id(call_id)
        name = name.strip()
        if not valid_name(name):
            return f"invalid function name {name[:40]!r}"
        value, text, reason = decode_json_text(raw)
        if reason is not None:
            return reason
        if type(value) is dict:
            return name, value, call_id, text
        args = arguments_object(value)
        if isinstance(args, str):
            return args
        return name, args, call_id, None


_KIMI_ID = re.compile(r"functions\.([^:]+):\d+")


def _name_from_id(call_id: str) -> str:
    """Kimi ids are `functions.NAME:INDEX`; "" when the header is not one."""
    m = _KIMI_ID.fullmatch(call_id)
    return m.group(1) if m else ""
