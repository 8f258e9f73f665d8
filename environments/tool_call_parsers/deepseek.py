"""DeepSeek V3 (V3-0324, R1-0528) and V3.1 (also V3.1-Terminus, V3.2-Exp in this format).

    V3:   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
          ```json
          {"city": "Paris"}
          ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Leniency: missing section tokens or a missing `<｜tool▁call▁end｜>` at the end of the text;
V3 with the code fence left out.
"""

from __future__ import annotations

from dataclasses import replace

from ._registry import register_parser
from ._token_calls import TokenCallParser, TokenCallSpec

__all__ = ["DeepSeekV3Parser", "DeepSeekV31Parser", "DEEPSEEK_V3", "DEEPSEEK_V31"]

DEEPSEEK_V3 = TokenCallSpec(
    section_begin=("<｜tool▁calls▁begin｜>",),
    section_end=("<｜tool▁calls▁end｜>",),
    call_begin="<｜tool▁call▁begin｜>",
    call_end="<｜tool▁call▁end｜>",
    sep="<｜tool▁sep｜>",
    layout="type_name_fenced",
)
DEEPSEEK_V31 = replace(DEEPSEEK_V3, layout="name_args")


@register_parser("deepseek_v3", "deepseekv3")
class DeepSeekV3Parser(TokenCallParser):
    spec = DEEPSEEK_V3


@register_parser("deepseek_v31", "deepseekv31", "deepseek_v3_1")
class DeepSeekV31Parser(TokenCallParser):
    spec = DEEPSEEK_V31
