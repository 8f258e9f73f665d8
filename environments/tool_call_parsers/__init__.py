"""Raw model text -> OpenAI tool calls, for every major model family.

    from environments.tool_call_parsers import get_parser
    content, tool_calls = get_parser("hermes").parse(text)

`parse` never raises: markup that cannot be read stays in `content` and produces no call;
`parse_detailed` also returns why each such block failed (`ParseResult.errors`), so rewards
and metrics can see format errors. Names are the ones vLLM and SGLang use (see
`list_parsers()`); new families register with `@register_parser("name", "alias")`.

Standard library only: other projects may vendor this directory as it is.
"""

from ._core import ParseIssue, ParseResult, ToolCallParser, make_call
from ._registry import UnknownParserError, get_parser, list_parsers, register_parser

__all__ = [
    "ParseIssue",
    "ParseResult",
    "ToolCallParser",
    "UnknownParserError",
    "get_parser",
    "list_parsers",
    "make_call",
    "register_parser",
]
