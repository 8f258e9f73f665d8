"""Writers for tests and benchmarks: tool calls in each family's markup, as the family's
chat template (or, without one offline, its documentation) writes them.

Each writer takes [(name, arguments)] and returns the completion text a model of that
family would produce. Used by this project's conformance, property and fuzzing tests and
by bench/parsers.py; other projects can use them to test their own parsers.
"""

from __future__ import annotations

import json
from typing import Any, Callable

__all__ = ["WRITERS", "LAYOUTS", "MARKUP", "Call"]

Call = tuple[str, dict[str, Any]]


def _json(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def hermes(calls: list[Call], start: str = "<tool_call>", end: str = "</tool_call>") -> str:
    # Spacing as the Hermes 2 Pro / Qwen2.5 templates write it.
    return "\n".join(f"{start}\n{_json({'name': n, 'arguments': a})}\n{end}" for n, a in calls)


def longcat(calls: list[Call]) -> str:
    # LongCat-Flash-Chat's template.
    return hermes(calls, "<longcat_tool_call>", "</longcat_tool_call>")


def longcat_xml(calls: list[Call]) -> str:
    # LongCat-Flash-Lite / LongCat 2.0 templates: the GLM layout in longcat tags.
    return glm(calls, prefix="longcat_")


def qwen3_coder_value(v: Any) -> str:
    # The Qwen3-Coder template: JSON for mappings/sequences, Python str() for the rest.
    return _json(v) if isinstance(v, (dict, list)) else str(v)


def qwen3_coder(calls: list[Call]) -> str:
    out = []
    for n, a in calls:
        params = "".join(f"<parameter={k}>\n{qwen3_coder_value(v)}\n</parameter>\n" for k, v in a.items())
        out.append(f"<tool_call>\n<function={n}>\n{params}</function>\n</tool_call>")
    return "\n".join(out)


def glm(calls: list[Call], newlines: bool = True, prefix: str = "") -> str:
    nl = "\n" if newlines else ""
    key, value, call = f"{prefix}arg_key", f"{prefix}arg_value", f"{prefix}tool_call"
    out = []
    for n, a in calls:
        pairs = "".join(
            f"{nl}<{key}>{k}</{key}>{nl}<{value}>{v if isinstance(v, str) else _json(v)}</{value}>"
            for k, v in a.items()
        )
        out.append(f"<{call}>{n}{pairs}{nl}</{call}>")
    return nl.join(out)


def glm47(calls: list[Call]) -> str:
    return glm(calls, newlines=False)


DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
K_BEGIN, K_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
K_CALL, K_ARGS, K_CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def deepseek_v3(calls: list[Call]) -> str:
    body = "\n".join(f"{DS_CALL}function{DS_SEP}{n}\n```json\n{_json(a)}\n```{DS_CALL_END}" for n, a in calls)
    return DS_BEGIN + body + DS_END


def deepseek_v31(calls: list[Call]) -> str:
    return DS_BEGIN + "".join(f"{DS_CALL}{n}{DS_SEP}{_json(a)}{DS_CALL_END}" for n, a in calls) + DS_END


def kimi_k2(calls: list[Call]) -> str:
    body = "".join(f"{K_CALL}functions.{n}:{i}{K_ARGS}{_json(a)}{K_CALL_END}" for i, (n, a) in enumerate(calls))
    return K_BEGIN + body + K_END


DSML = "｜DSML｜"


def deepseek_v32(calls: list[Call]) -> str:
    # DeepSeek V3.2's template: strings raw with string="true", everything else JSON.
    out = [f"<{DSML}function_calls>\n"]
    for n, a in calls:
        out.append(f'<{DSML}invoke name="{n}">\n')
        for k, v in a.items():
            if isinstance(v, str):
                out.append(f'<{DSML}parameter name="{k}" string="true">{v}</{DSML}parameter>\n')
            else:
                out.append(f'<{DSML}parameter name="{k}" string="false">{_json(v)}</{DSML}parameter>\n')
        out.append(f"</{DSML}invoke>\n")
    out.append(f"</{DSML}function_calls>")
    return "".join(out)


def llama3_json(calls: list[Call]) -> str:
    # The Llama 3.1 template's shape; several calls separated by `;` as vLLM documents.
    return "; ".join(_json({"name": n, "parameters": a}) for n, a in calls)


def llama4_json(calls: list[Call]) -> str:
    # No offline Llama 4 template writes JSON calls; this is the model card's format.
    return "<|python_start|>" + llama3_json(calls) + "<|python_end|>"


def mistral(calls: list[Call]) -> str:
    # Mistral Small 3.2 / Devstral / Ministral 3 templates: one [TOOL_CALLS] per call.
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{_json(a)}" for n, a in calls)


def pythonic(calls: list[Call]) -> str:
    inner = ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in calls)
    return f"[{inner}]"


def gpt_oss(calls: list[Call]) -> str:
    return "".join(
        f"<|start|>assistant to=functions.{n}<|channel|>commentary json<|message|>{_json(a)}<|call|>" for n, a in calls
    )


# Canonical parser name -> writer (every family once).
WRITERS: dict[str, Callable[[list[Call]], str]] = {
    "hermes": hermes,
    "longcat": longcat,
    "qwen3_coder": qwen3_coder,
    "glm45": glm,
    "glm47": glm47,
    "deepseek_v3": deepseek_v3,
    "deepseek_v31": deepseek_v31,
    "deepseek_v32": deepseek_v32,
    "kimi_k2": kimi_k2,
    "llama3_json": llama3_json,
    "llama4_json": llama4_json,
    "mistral": mistral,
    "pythonic": pythonic,
    "gpt_oss": gpt_oss,
}

# Layouts to test: label -> (parser name, writer). A family with two layouts under one
# name (LongCat) appears twice; labels are "name" or "name:layout".
LAYOUTS: dict[str, tuple[str, Callable[[list[Call]], str]]] = {
    **{name: (name, write) for name, write in WRITERS.items()},
    "longcat:xml": ("longcat", longcat_xml),
}

# Markup strings of each layout (the fuzzer corrupts these).
MARKUP: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>", "</tool_call>", '"name"', '"arguments"'),
    "longcat": ("<longcat_tool_call>", "</longcat_tool_call>", '"name"', '"arguments"'),
    "qwen3_coder": ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"),
    "glm45": ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    "glm47": ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    "deepseek_v3": (DS_BEGIN, DS_END, DS_CALL, DS_CALL_END, DS_SEP, "```json", "```"),
    "deepseek_v31": (DS_BEGIN, DS_END, DS_CALL, DS_CALL_END, DS_SEP),
    "deepseek_v32": (
        f"<{DSML}function_calls>",
        f"</{DSML}function_calls>",
        f"<{DSML}invoke",
        f"</{DSML}invoke>",
        f"<{DSML}parameter",
        f"</{DSML}parameter>",
        'string="',
    ),
    "longcat:xml": (
        "<longcat_tool_call>",
        "</longcat_tool_call>",
        "<longcat_arg_key>",
        "</longcat_arg_key>",
        "<longcat_arg_value>",
        "</longcat_arg_value>",
    ),
    "kimi_k2": (K_BEGIN, K_END, K_CALL, K_CALL_END, K_ARGS, "functions."),
    "llama3_json": ('"name"', '"parameters"', "; "),
    "llama4_json": ("<|python_start|>", "<|python_end|>", '"name"', '"parameters"'),
    "mistral": ("[TOOL_CALLS]", "[ARGS]"),
    "pythonic": ("[", "]", "(", ")", "="),
    "gpt_oss": ("<|start|>", "<|channel|>", "<|message|>", "<|call|>", "to=functions.", "commentary"),
}
