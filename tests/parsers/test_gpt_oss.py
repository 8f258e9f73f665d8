"""gpt_oss: the harmony format (channels; a call is a message to functions.NAME)."""

from __future__ import annotations

import pytest

from environments.tool_call_parsers import get_parser

from environments.tool_call_parsers import testing as writers
from ._conformance import PING, WEATHER, Call, ParserConformance, calls_of


class TestGptOss(ParserConformance):
    names = ("gpt_oss", "gpt-oss", "openai")
    malformed = (
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": <|call|>',
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>[1]<|call|>",
        "<|start|>assistant to=browser.search<|channel|>commentary json<|message|>{}<|call|>",
    )
    trailing_text = False  # the model stops at <|call|>

    def render(self, calls: list[Call]) -> str:
        return writers.gpt_oss(calls)


GPT_OSS_CASES = {
    "analysis then call (as generated after '<|start|>assistant')": (
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.ping<|channel|>commentary json<|message|>{}<|call|>",
        None,
        "Need the weather.",
        [PING],
    ),
    "recipient after the channel, constrain token": (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "celsius"}<|call|>',
        None,
        None,
        [WEATHER],
    ),
    "final answer": (
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>",
        "It is sunny.",
        "think",
        [],
    ),
    "call without <|call|> at the end": (
        " to=functions.ping<|channel|>commentary json<|message|>{}",
        None,
        None,
        [PING],
    ),
    "plain text": ("No harmony here.", "No harmony here.", None, []),
}


@pytest.mark.parametrize("text, content, reasoning, calls", GPT_OSS_CASES.values(), ids=list(GPT_OSS_CASES))
def test_gpt_oss_cases(text, content, reasoning, calls):
    result = get_parser("gpt_oss").parse_detailed(text)
    assert (result.content, result.reasoning, calls_of(result.tool_calls)) == (content, reasoning, calls)
    assert result.errors == []
