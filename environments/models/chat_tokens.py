"""Chat-mode tokens: re-render the finished conversation with the tokenizer's chat template.

This is an approximation of what the model saw (a re-render is not what was sampled);
it is what an OpenAI chat endpoint allows. Exact ids, masks and logprobs come from a
token server (token mode). Assistant spans are trained (mask = id), everything else -100.
"""

from __future__ import annotations

import json
from typing import Any

from environments.models.literal_specials import SpecialTokenShield

__all__ = ["tokenize_conversation", "json_or_raw"]

IGNORE = -100


def _renderable(messages: list[dict[str, Any]], template_knows_tool_calls: bool) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        m = dict(m)
        m.pop("reasoning_content", None)
        if m.get("content") is None:
            m["content"] = ""
        calls = m.get("tool_calls")
        if calls and not template_knows_tool_calls:
            # A template that ignores tool_calls would drop the call text the model wrote;
            # keep it in hermes form so the trained tokens include the call.
            text = "".join(
                "<tool_call>\n"
                + json.dumps({"name": c["function"]["name"], "arguments": json_or_raw(c["function"].get("arguments"))})
                + "\n</tool_call>"
                for c in calls
            )
            m["content"] = (m["content"] + "\n" if m["content"] else "") + text
            m.pop("tool_calls")
        elif calls:
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json_or_raw(c["function"].get("arguments"))}}
                for c in calls
            ]
        out.append(m)
    return out


def json_or_raw(arguments: Any) -> Any:
    """Arguments as an object when they are JSON (they usually are), else the raw string."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def tokenize_conversation(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, prompt_len: int = 0
):
    """-> (token ids, masks) for a finished conversation. The first `prompt_len` messages are the env's
    prompt: an assistant message there (a fixed greeting, a few-shot example) is not the policy's, never trained."""
    template = getattr(tokenizer, "chat_template", None) or ""
    shield = SpecialTokenShield(tokenizer)  # control tokens spelled in the messages stay text
    msgs = shield.messages(_renderable(messages, "tool_calls" in template))

    def render(part: list[dict[str, Any]], generation_prompt: bool) -> str:
        if not part:
            return ""
        return tokenizer.apply_chat_template(
            part, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )

    full = render(msgs, False)
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant" or i < prompt_len:
            continue
        start = len(render(msgs[:i], True))
        end = len(render(msgs[: i + 1], False))
        spans.append((start, end))
    ids, offsets = shield.encode_with_offsets(full)
    masks = [tok if any(s <= a < e for s, e in spans) else IGNORE for tok, (a, _b) in zip(ids, offsets)]
    return ids, masks
