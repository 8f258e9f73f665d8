"""Raw model text -> OpenAI tool calls, for every major model family.

    from environments.tool_call_parsers import get_parser
    content, tool_calls = get_parser("hermes").parse(text)

`parse` never raises: markup that cannot be read stays in `content` and produces no call;
`parse_detailed(text, tools=None)` also returns why each such block failed
(`ParseResult.errors`), so rewards and metrics can see format errors. With `tools` (OpenAI
tool definitions, also accepted by `get_parser`) the XML families convert parameter values
to the declared types. `parser.stream()` parses one completion incrementally.

Names are the ones vLLM and SGLang use (`list_parsers()`); a new family registers with
`@register_parser("name", "alias")` and is written as a small spec over a shared engine
where it is a variant of an existing format. `testing` writes calls in every family's
format, for tests.

Standard library only: other projects may vendor this directory as it is.
"""

from ._core import ParseIssue, ParseResult, ToolCallParser, ToolCallStream, make_call
from ._registry import UnknownParserError, get_parser, list_parsers, register_parser

__all__ = [
    "ParseIssue",
    "ParseResult",
    "ToolCallParser",
    "ToolCallStream",
    "UnknownParserError",
    "get_parser",
    "list_parsers",
    "make_call",
    "register_parser",
]
