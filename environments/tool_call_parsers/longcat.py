"""LongCat: two formats under one name, told apart by what follows the opening tag.

    LongCat-Flash-Chat (JSON, the hermes layout in longcat tags):
        <longcat_tool_call>
        {"name": "get_weather", "arguments": {"city": "Paris"}}
        </longcat_tool_call>
    LongCat-Flash-Lite and LongCat 2.0 (the GLM layout in longcat tags):
        <longcat_tool_call>get_weather
        <longcat_arg_key>city</longcat_arg_key>
        <longcat_arg_value>Paris</longcat_arg_value>
        </longcat_tool_call>

Both are the shared engines with LongCat's tags: specs, not new code.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Mapping

from ._core import ParseResult, ToolCallParser
from ._registry import register_parser
from .glm import GLM, GlmParser
from .hermes import HERMES, JsonTagParser

__all__ = ["LongcatParser", "LONGCAT_JSON", "LONGCAT_XML"]

LONGCAT_JSON = replace(HERMES, start="<longcat_tool_call>", end="</longcat_tool_call>")
LONGCAT_XML = replace(
    GLM,
    start="<longcat_tool_call>",
    end="</longcat_tool_call>",
    key=("<longcat_arg_key>", "</longcat_arg_key>"),
    value=("<longcat_arg_value>", "</longcat_arg_value>"),
)
# A function name right after the tag means the key/value layout; `{`/`[` means JSON.
_XML_LAYOUT = re.compile(r"<longcat_tool_call>\s*[A-Za-z0-9_]")


class _LongcatJson(JsonTagParser):
    spec = LONGCAT_JSON


class _LongcatXml(GlmParser):
    spec = LONGCAT_XML


@register_parser("longcat")
class LongcatParser(ToolCallParser):
    stream_markers = (LONGCAT_JSON.start, LONGCAT_JSON.end, "{", "[")

    def __init__(self, tools=None) -> None:
        super().__init__(tools)
        self._json = _LongcatJson(tools)
        self._xml = _LongcatXml(tools)

    def _parse(self, text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ParseResult:
        engine = self._xml if _XML_LAYOUT.search(text) else self._json
        return engine._parse(text, schemas)
