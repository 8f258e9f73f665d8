"""Chat-mode model client: any OpenAI-compatible chat-completions endpoint.

Tool calls come back structured when the server parses them; when a server leaves
them as text in `content` (llama.cpp with small models does), they are recovered
with the tool-call parser registry, and any markup that fails to parse is reported.
This client cannot give the exact tokens the model sampled: use a token server
(token mode) for RL on token ids.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

import openai
from pydantic import BaseModel, Field

from environments.models.base import (
    ModelError,
    ModelRequestError,
    ModelTurn,
    TurnOptions,
    clean_turn,
    is_request_error,
    turn_from_text,
)
from environments.models.tool_choice import offered_tools, wire_value
from environments.models.tool_grammar import tool_choice_grammar
from environments.tool_call_parsers import get_parser

__all__ = ["OpenAIChatConfig", "OpenAIChatModel"]

# openai>=1 refuses an empty key; local servers ignore whatever is sent.
PLACEHOLDER_API_KEY = "not-needed-for-local-servers"


class OpenAIChatConfig(BaseModel):
    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(2, ge=0)
    text_tool_parser: str | None = Field(
        "hermes", description="Parser for tool calls a server returns as text; None disables recovery"
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Extra request fields, e.g. a llama.cpp grammar"
    )
    tools_in: Literal["request", "system_prompt"] = Field(
        "request",
        description="'request': send tools= (the server's template renders them); 'system_prompt': describe "
        "them in Hermes format in the system message, for servers that cannot take tools= (llama.cpp "
        "refuses tools= together with a custom grammar)",
    )


def _strip_for_request(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # reasoning_content is ours to keep in the trajectory; servers reject or re-render it.
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]


def hermes_tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The Hermes function-calling instructions, as Hermes 2 Pro's template writes them."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You are a function calling AI model. You are provided with function signatures within "
        f"<tools></tools> XML tags.\n<tools>\n{listing}\n</tools>\nFor each function call, return a json "
        "object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-dict>}\n</tool_call>'
    )


def _with_tools_in_system(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    block = hermes_tools_system_prompt(tools)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{block}")
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


class OpenAIChatModel:
    def __init__(self, config: OpenAIChatConfig, client: openai.AsyncOpenAI | None = None) -> None:
        self.config = config
        self._client = client or self.make_client(config.base_url, config.api_key, config.timeout_s, config.max_retries)
        self._parser = get_parser(config.text_tool_parser) if config.text_tool_parser else None

    @staticmethod
    def make_client(base_url: str, api_key: str | None, timeout_s: float, max_retries: int = 2) -> openai.AsyncOpenAI:
        """One client per server, shared by the trajectories that use it (one connection pool)."""
        return openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or PLACEHOLDER_API_KEY, timeout=timeout_s, max_retries=max_retries
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], options: TurnOptions
    ) -> ModelTurn:
        tool_choice = options.tool_choice
        grammar = None
        try:
            offered_tools(tools, tool_choice)  # a named tool that is not offered stops the command
            if tools and self.config.tools_in == "system_prompt":
                # The server never sees tools=: the choice becomes a grammar over the Hermes markup the
                # system prompt asks for (llama.cpp's `grammar` field).
                grammar = tool_choice_grammar(self._parser or get_parser("hermes"), tools, tool_choice)
        except ValueError as exc:
            raise ModelRequestError(str(exc)) from None
        request_messages = _strip_for_request(messages)
        if tools and self.config.tools_in == "system_prompt":
            request_messages = _with_tools_in_system(request_messages, tools)
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "messages": request_messages,
            "temperature": options.temperature,
        }
        if tools and self.config.tools_in == "request":
            kwargs["tools"] = tools
            if tool_choice != "auto":  # the server constrains the turn (OpenAI, vLLM, llama.cpp --jinja)
                kwargs["tool_choice"] = wire_value(tool_choice)
        if options.max_tokens is not None:
            kwargs["max_tokens"] = options.max_tokens
        if self.config.extra_body or grammar is not None:
            kwargs["extra_body"] = {**self.config.extra_body, **({"grammar": grammar} if grammar else {})}
        try:
            response = await self._client.chat.completions.create(**kwargs)
        except openai.APIConnectionError as exc:
            raise ModelError(
                f"cannot reach the model server at {self.config.base_url}: {exc.__cause__ or exc}; "
                "check --openai.base_url and that the server is running"
            ) from exc
        except openai.APIStatusError as exc:
            if is_request_error(exc.status_code):
                raise ModelRequestError(
                    f"model server at {self.config.base_url} refused the request (HTTP {exc.status_code}): {exc.message}"
                ) from exc
            raise ModelError(
                f"model server at {self.config.base_url} answered HTTP {exc.status_code}: {exc.message}",
                retryable=exc.status_code >= 500 or exc.status_code == 429,
            ) from exc
        except openai.APIError as exc:
            raise ModelError(f"model server at {self.config.base_url} failed: {exc}") from exc
        if not response.choices:
            raise ModelError(f"model server at {self.config.base_url} returned no choices")
        choice = response.choices[0]
        msg = choice.message
        extra = msg.model_extra or {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        usage = (
            response.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"})
            if response.usage
            else None
        )
        calls = [
            {
                "id": c.id or f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments or "{}"},
            }
            for c in (msg.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        # Escaped lone surrogates in the server's JSON become U+FFFD here, before anything re-encodes them.
        turn = clean_turn(
            ModelTurn(
                content=msg.content,
                tool_calls=calls,
                reasoning_content=reasoning,
                finish_reason=choice.finish_reason,
                usage=usage,
            )
        )
        if calls or not turn.content or self._parser is None or tool_choice == "none":
            return turn  # under `none` no text is read as a call
        # The server left the calls in the text: read them the same way token mode does.
        recovered = turn_from_text(
            self._parser, turn.content, tools, reasoning=turn.reasoning_content, finish_reason=choice.finish_reason
        )
        recovered.usage = usage
        if not recovered.tool_calls:
            recovered.content = turn.content  # nothing to take out: the text stays as the server sent it
        return recovered
