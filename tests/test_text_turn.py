"""One text -> turn path for both modes: chat mode reads calls left in the text with the
offered tools' schemas, exactly as token mode does."""

from __future__ import annotations

import json

from environments.models.base import TurnOptions, turn_from_text
from environments.models.chat_mode import OpenAIChatConfig, OpenAIChatModel
from environments.tool_call_parsers import get_parser
from tests.support.scripted_openai import ScriptedOpenAIServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_files",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "regex": {"type": "boolean"},
                    "limit": {"type": "integer"},
                },
            },
        },
    }
]
# Qwen3-Coder writes scalars with Python's str(): `True` is not JSON, so only the schema makes it a bool.
TEXT = (
    "<tool_call>\n<function=search_files>\n<parameter=pattern>\n42\n</parameter>\n"
    "<parameter=regex>\nTrue\n</parameter>\n<parameter=limit>\n7\n</parameter>\n</function>\n</tool_call>"
)


async def test_chat_mode_recovers_text_calls_with_the_tool_schemas():
    async with ScriptedOpenAIServer([{"content": TEXT}]) as server:
        model = OpenAIChatModel(
            OpenAIChatConfig(base_url=server.base_url, model="scripted", max_retries=0, text_tool_parser="qwen3_coder")
        )
        turn = await model.chat(
            [{"role": "user", "content": "find"}], TOOLS, TurnOptions(temperature=0.0, max_tokens=None)
        )
        await model.aclose()
    (call,) = turn.tool_calls
    assert json.loads(call["function"]["arguments"]) == {"pattern": "42", "regex": True, "limit": 7}
    assert turn.calls_from_text and not turn.parse_errors
    shared = turn_from_text(get_parser("qwen3_coder"), TEXT, TOOLS)  # the path token mode takes
    assert [c["function"] for c in shared.tool_calls] == [call["function"]]
    untyped = turn_from_text(get_parser("qwen3_coder"), TEXT, [])
    assert json.loads(untyped.tool_calls[0]["function"]["arguments"])["regex"] == "True"  # why schemas matter
