"""DeepSeek V3.2 ("DSML"): XML-like invocations whose parameters say whether they are strings.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

`string="true"`: the value is the text as written; `string="false"`: it is JSON. Leniency:
a missing `</｜DSML｜function_calls>` or `</｜DSML｜invoke>` at the end of the text.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ._core import (
    JSON_DECODER,
    ParseIssue,
    ParseResult,
    TagBlocks,
    ToolCallParser,
    block_extent,
    issue,
    join_content,
    make_call,
    valid_name,
)
from ._params import ParamError, ParamTags, read_params
from ._registry import register_parser

__all__ = ["DeepSeekV32Parser"]

_T = "｜DSML｜"
_BLOCK, _BLOCK_END = f"<{_T}function_calls>", f"</{_T}function_calls>"
_INVOKE = re.compile(rf'<{_T}invoke name="([^"\n]*)">')
_INVOKE_END = f"</{_T}invoke>"
_PARAM = re.compile(rf'<{_T}parameter name="([^"\n]*)" string="(true|false)">')


def _value(m: re.Match[str], name: str, key: str, raw: str, schema: Any) -> Any:
    if m.group(2) == "true":
        return raw
    try:
        return JSON_DECODER.decode(raw.strip())
    except ValueError as exc:
        raise ParamError(
            f'parameter {key} of {name} is marked string="false" but is not JSON: {getattr(exc, "msg", exc)}'
        ) from None


_TAGS = ParamTags(
    _PARAM, f"</{_T}parameter>", where="invoke {name}", label="parameter {key}", next_open=None, value=_value
)

_UNTYPED: Mapping[str, Any] = {}  # values are typed by their string= flag, not the schema


@register_parser("deepseek_v32", "deepseekv32")
class DeepSeekV32Parser(ToolCallParser):
    stream_markers = (_BLOCK, f"<{_T}invoke")

    def _parse(self, text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ParseResult:
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        copied = 0
        blocks = TagBlocks(text, _BLOCK, _BLOCK_END)
        while (s := blocks.opens.find(copied)) != -1:
            pieces.append(text[copied:s])
            body_start = s + len(_BLOCK)
            body_end, block_end = blocks.extent(body_start)
            self._block(text, body_start, body_end, calls, errors, pieces)
            copied = block_end
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)

    def _block(self, text, start, end, calls, errors, pieces) -> None:
        pos = start
        while True:
            m = _INVOKE.search(text, pos, end)
            stop = m.start() if m else end
            if text[pos:stop].strip():
                errors.append(issue(text, pos, stop, "text between invocations"))
                pieces.append(text[pos:stop])
            if m is None:
                return
            nxt = _INVOKE.search(text, m.end(), end)
            nxt_start = nxt.start() if nxt else -1
            close = text.find(_INVOKE_END, m.end(), nxt_start if nxt else end)
            body_end, invoke_end = block_extent(close, nxt_start, len(_INVOKE_END), end)
            parsed = self._invoke(text, m, body_end)
            if isinstance(parsed, str):
                errors.append(issue(text, m.start(), invoke_end, parsed))
                pieces.append(text[m.start() : invoke_end])
            else:
                calls.append(make_call(*parsed))
            pos = invoke_end

    def _invoke(self, text: str, m: re.Match[str], end: int) -> tuple[str, dict[str, Any]] | str:
        name = m.group(1).strip()
        if not valid_name(name):
            return f"invalid function name {name[:40]!r}"
        read = read_params(_TAGS, text, m.end(), end, name, _UNTYPED)
        if isinstance(read, str):
            return read
        args, pos = read
        rest = text[pos:end].strip()
        if rest:
            return f"unexpected text inside invoke {name}: {rest[:30]!r}"
        return name, args
