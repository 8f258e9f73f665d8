"""Qwen3-Coder XML calls (also Qwen3.5 / Qwen3-Coder-Next):

    <tool_call>
    <function=write_file>
    <parameter=path>
    notes.txt
    </parameter>
    <parameter=content>
    two
    lines
    </parameter>
    </function>
    </tool_call>

Values are text: JSON when valid JSON, else the string (the template writes strings raw,
objects/lists as JSON and other scalars with Python's `str`, so `True`/`None` need the
tool schema to come back typed). The one newline the template adds on each side of a
value is removed. Leniency: a missing `<tool_call>` wrapper, a missing `</function>` or
`</tool_call>` at the end of the text.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ._values import coerce_value
from ._core import ParseIssue, ParseResult, TagBlocks, ToolCallParser, issue, join_content, make_call, valid_name
from ._params import ParamTags, read_params
from ._registry import register_parser

__all__ = ["Qwen3CoderParser"]

_FUNCTION = "<function="
_FUNCTION_END = "</function>"
_PARAM = re.compile(r"<parameter=([^>\n]*)>")
_WRAP_START, _WRAP_END = "<tool_call>", "</tool_call>"
_WRAP_CLOSE = re.compile(r"\s*</tool_call>")  # used with .match(text, pos)


def strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _value(m: re.Match[str], name: str, key: str, raw: str, schema: Any) -> Any:
    return coerce_value(strip_one_newline(raw), schema)


_TAGS = ParamTags(
    _PARAM,
    "</parameter>",
    where="<function={name}>",
    label="<parameter={key}>",
    next_open="<parameter=",
    value=_value,
)


@register_parser("qwen3_coder", "qwen3_xml")
class Qwen3CoderParser(ToolCallParser):
    stream_markers = ("<tool_call>", _FUNCTION)

    def _parse(self, text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ParseResult:
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        copied = 0
        i = 0
        blocks = TagBlocks(text, _FUNCTION, _FUNCTION_END)
        while (s := blocks.opens.find(i)) != -1:
            name_end = text.find(">", s, s + len(_FUNCTION) + 130)  # names are at most 128 characters
            body_end, unit_end = blocks.extent(s + 1)
            if body_end == unit_end:  # </function> missing: a closing wrapper before the next call ends it too
                wrap = text.rfind(_WRAP_END, s, body_end)
                if wrap != -1:
                    body_end = unit_end = wrap
            parsed = self._function(text, s, name_end, body_end, schemas)
            if isinstance(parsed, str):
                errors.append(issue(text, s, unit_end, parsed))
                i = s + len(_FUNCTION)
                continue
            # Remove the <tool_call> wrapper with the call when it is there.
            block_start = _wrap_start(text, copied, s)
            after = _WRAP_CLOSE.match(text, unit_end)
            block_end = after.end() if after else unit_end
            pieces.append(text[copied:block_start])
            calls.append(make_call(*parsed))
            copied = i = block_end
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)

    def _function(
        self, text: str, s: int, name_end: int, body_end: int, schemas: Mapping[str, Mapping[str, Any]]
    ) -> tuple[str, dict[str, Any]] | str:
        if name_end == -1 or name_end > body_end:
            return "unterminated <function=...> tag"
        name = text[s + len(_FUNCTION) : name_end].strip()
        if not valid_name(name):
            return f"invalid function name {name!r}"
        read = read_params(_TAGS, text, name_end + 1, body_end, name, schemas.get(name, {}))
        if isinstance(read, str):
            return read
        args, pos = read
        rest = text[pos:body_end].strip()
        if rest:
            reason = "unterminated <parameter=...>" if rest.startswith("<parameter=") else "unexpected text"
            return f"{reason} inside <function={name}>: {rest[:30]!r}"
        return name, args


def _wrap_start(text: str, lo: int, s: int) -> int:
    """Where the `<tool_call>` wrapping the function at `s` starts (s when there is none)."""
    j = s
    while j > lo and text[j - 1] in " \t\r\n":
        j -= 1
    k = j - len(_WRAP_START)
    return k if k >= lo and text.startswith(_WRAP_START, k) else s
