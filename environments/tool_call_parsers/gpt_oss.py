"""gpt-oss (OpenAI harmony format): messages with channels; a call is a message to a function.

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

The recipient may also follow the channel (`<|channel|>commentary to=functions.x
<|constrain|>json<|message|>`). `content` is the text of the final channel (and of
commentary messages to nobody); the analysis channel becomes `ParseResult.reasoning`.
Text without any harmony token is plain content. Leniency: a missing `<|call|>`/`<|end|>`
at the end of the text.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ._core import (
    NAME_PATTERN,
    ParseIssue,
    ParseResult,
    ToolCallParser,
    arguments_object,
    decode_json_exact,
    issue,
    make_call,
)
from ._registry import register_parser

__all__ = ["GptOssParser"]

_START = "<|start|>"
_MESSAGE = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(rf"to=functions\.({NAME_PATTERN})(?![^\s<])")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


@register_parser("gpt_oss", "gpt-oss", "openai")
class GptOssParser(ToolCallParser):
    # Which channel text belongs to is known only from headers that may come later:
    # a stream holds everything until finish().
    stream_markers = None

    def _parse(self, text: str, schemas: Mapping[str, Any]) -> ParseResult:
        if _MESSAGE not in text and "<|channel|>" not in text:
            return ParseResult(text.strip() or None)
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        pos = 0
        while pos < len(text):
            m = text.find(_MESSAGE, pos)
            if m == -1:
                tail = text[pos:]
                if tail.strip():
                    errors.append(issue(text, pos, len(text), "harmony header without <|message|>"))
                    content.append(tail)
                break
            header_start = pos + _header_offset(text[pos:m])
            stray = text[pos:header_start]
            if stray.strip() and stray.strip() != "assistant":
                content.append(stray)  # prose outside any message stays content
            header = text[header_start:m]
            body_start = m + len(_MESSAGE)
            end, end_len = _first_end(text, body_start)
            body = text[body_start:end]
            channel = _CHANNEL.search(header)
            recipient = _RECIPIENT.search(header)
            if header.count("to=") > 1 or any(tok in header for tok in _ENDS):
                # The previous message lost its <|message|> or this one its <|start|>:
                # two headers ran together and neither can be trusted.
                errors.append(issue(text, header_start, end + end_len, "damaged harmony message header"))
                content.append(text[header_start : end + end_len])
            elif recipient:
                value, reason = decode_json_exact(body)
                args = arguments_object(value) if reason is None else reason
                if isinstance(args, str):
                    errors.append(issue(text, header_start, end + end_len, args))
                    content.append(text[header_start : end + end_len])
                else:
                    calls.append(make_call(recipient.group(1), args))
            elif "to=" in header and "to=assistant" not in header:
                errors.append(
                    issue(text, header_start, end + end_len, "message to a recipient that is not functions.NAME")
                )
                content.append(body)
            elif channel and channel.group(1) == "analysis":
                reasoning.append(body)
            else:
                content.append(body)
            pos = end + end_len
        return ParseResult(
            "\n".join(c.strip() for c in content if c.strip()) or None,
            calls,
            errors,
            reasoning="\n".join(r.strip() for r in reasoning if r.strip()) or None,
        )


def _header_offset(header: str) -> int:
    """Where the message header starts inside `header` (the last <|start|>, else the channel)."""
    p = header.rfind(_START)
    if p != -1:
        return p
    found = [q for q in (header.find("<|channel|>"), header.find("to=")) if q != -1]
    return min(found) if found else 0


_BOUNDARY = re.compile("|".join(re.escape(t) for t in (*_ENDS, _START)))


def _first_end(text: str, start: int) -> tuple[int, int]:
    """The end of a message body: the first end token, the next <|start|>, or the text's end."""
    m = _BOUNDARY.search(text, start)
    if m is None:
        return len(text), 0
    return (m.start(), 0) if m.group() == _START else (m.start(), len(m.group()))
