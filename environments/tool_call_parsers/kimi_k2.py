"""Kimi K2 (Instruct, 0905, Thinking): the header of each call is its id, `functions.NAME:IDX`.

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

The id is kept as the OpenAI call id (the template writes it back verbatim, so the next
turn's prompt stays what the model saw). Some checkpoints write `tool_call_section`
(singular); both spellings are accepted.
"""

from __future__ import annotations

from ._registry import register_parser
from ._token_calls import TokenCallParser, TokenCallSpec

__all__ = ["KimiK2Parser", "KIMI_K2"]

KIMI_K2 = TokenCallSpec(
    section_begin=("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"),
    section_end=("<|tool_calls_section_end|>", "<|tool_call_section_end|>"),
    call_begin="<|tool_call_begin|>",
    call_end="<|tool_call_end|>",
    sep="<|tool_call_argument_begin|>",
    layout="id_args",
)


@register_parser("kimi_k2")
class KimiK2Parser(TokenCallParser):
    spec = KIMI_K2
