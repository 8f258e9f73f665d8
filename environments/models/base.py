"""The model seam of the agent loop.

`ChatModel.chat(messages, tools, options)` returns one assistant turn sampled as the `TurnOptions`
say. Chat mode talks to an OpenAI-compatible chat endpoint (`OpenAIChatModel`); token mode
(`TokenChatModel`) implements the same protocol while holding the exact token ids of the conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from environments.models.tool_choice import ToolChoice
    from environments.tool_call_parsers import ToolCallParser

__all__ = [
    "ModelTurn",
    "TurnOptions",
    "ChatModel",
    "ModelError",
    "ModelRequestError",
    "clean_text",
    "clean_turn",
    "turn_from_text",
]


class ModelError(Exception):
    """The model server failed (unreachable, 5xx, malformed answer): infrastructure, not the model's fault."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class ModelRequestError(ModelError):
    """The server refused the request itself (HTTP 4xx other than 408/429): a request or config
    error, the same for every retry; it stops the command instead of being retried."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def is_request_error(status: int) -> bool:
    return 400 <= status < 500 and status not in (408, 429)


@dataclass
class ModelTurn:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI-shaped
    reasoning_content: str | None = None
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    # Why parts of the text could not be read as tool calls (format errors are data).
    parse_errors: list[str] = field(default_factory=list)
    # True when the calls were recovered from text rather than returned structured.
    calls_from_text: bool = False

    def as_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """How one assistant turn is sampled: the options that travel together to every ChatModel."""

    temperature: float
    max_tokens: int | None = None  # None: the server's (or token mode's configured) default
    tool_choice: ToolChoice = "auto"  # environments/models/tool_choice.py


@runtime_checkable
class ChatModel(Protocol):
    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], options: TurnOptions
    ) -> ModelTurn:
        """One assistant turn sampled as `options` say. Raises ModelError when the server cannot answer."""
        ...


def clean_text(text: str) -> str:
    """`text` with every lone surrogate as U+FFFD (a split pair is joined again).

    A model's JSON may carry an escaped half of a surrogate pair (`\\ud83d`); Python decodes it
    into a str that UTF-8 cannot encode, so a tokenizer, a JSONL writer or a sandbox file write
    would fail on it later, far from the model. Valid text comes back as the same object.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _clean_value(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_clean_value(v) for v in value]
    if isinstance(value, dict):
        return {clean_text(k): _clean_value(v) for k, v in value.items()}
    return value


def _clean_arguments(arguments: Any) -> Any:
    """Arguments text with no lone surrogate in it, nor in what it decodes to; else kept as written."""
    if not isinstance(arguments, str):
        return _clean_value(arguments)
    arguments = clean_text(arguments)
    if "\\u" not in arguments:  # no JSON escape at all: decoding cannot produce a surrogate
        return arguments
    try:
        decoded = json.loads(arguments)
    except ValueError:
        return arguments  # not JSON: the tool registry reports it to the model
    cleaned = _clean_value(decoded)
    return arguments if cleaned == decoded else json.dumps(cleaned, ensure_ascii=False)


def clean_turn(turn: ModelTurn) -> ModelTurn:
    """The turn with its text made valid Unicode (see `clean_text`): where model output is taken in."""
    if isinstance(turn.content, str):
        turn.content = clean_text(turn.content)
    if isinstance(turn.reasoning_content, str):
        turn.reasoning_content = clean_text(turn.reasoning_content)
    for call in turn.tool_calls:
        fn = call.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                fn["name"] = clean_text(fn["name"])
            if "arguments" in fn:
                fn["arguments"] = _clean_arguments(fn["arguments"])
    turn.parse_errors = [clean_text(e) for e in turn.parse_errors]
    return turn


def turn_from_text(
    parser: ToolCallParser,
    text: str,
    tools: list[dict[str, Any]],
    *,
    reasoning: str | None = None,
    finish_reason: str | None = None,
) -> ModelTurn:
    """The one text -> turn path of both modes: calls are read with the offered tools' schemas
    (so XML-family arguments get their declared types), and blocks that fail to parse are kept
    as `parse_errors`."""
    result = parser.parse_detailed(text, tools)
    return clean_turn(
        ModelTurn(
            content=result.content,
            tool_calls=list(result.tool_calls),
            # gpt-oss (harmony) carries its analysis channel in the raw text; its parser splits it off.
            reasoning_content=reasoning or result.reasoning,
            finish_reason=finish_reason,
            parse_errors=[str(e) for e in result.errors],
            calls_from_text=bool(result.tool_calls),
        )
    )
