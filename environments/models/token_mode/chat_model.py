"""Token-mode model client: a `ChatModel` that talks to a token server and keeps exact ids.

The agent loop sees an ordinary chat model (messages in, an assistant turn with tool calls
out). Underneath, one `TokenSession` per trajectory holds the ids the model saw and
produced; tool calls are recovered from the generated text with the parser registry
(`--env.runtime.tool_call_parser`). `token_trace()` hands the env the tokens, masks and logprobs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from environments.models.base import ModelError, ModelRequestError, ModelTurn, TurnOptions, turn_from_text
from environments.tool_call_parsers import get_parser

from environments.models.tool_grammar import tool_choice_grammar

from .servers import TokenServer
from .session import TokenSession, TokenTrace
from .template import ChatRenderer

__all__ = ["TokenChatConfig", "TokenChatModel"]


class TokenChatConfig(BaseModel):
    tool_call_parser: str = Field("hermes", description="Parser registry name for tool calls in the generated text")
    max_context_tokens: int | None = Field(None, ge=1, description="Prompt + generation cap (None: the server decides)")
    default_max_tokens: int = Field(1024, ge=1, description="Generation cap when the loop sets none")
    split_reasoning: bool = Field(True, description="Move a leading <think>...</think> block into reasoning_content")
    seed: int | None = None


class TokenChatModel:
    """One trajectory's model: create a new one per rollout (it holds that rollout's ids)."""

    def __init__(self, server: TokenServer, renderer: ChatRenderer, config: TokenChatConfig | None = None) -> None:
        self.server = server
        self.renderer = renderer
        self.config = config or TokenChatConfig()
        self._parser = get_parser(self.config.tool_call_parser)
        self._session: TokenSession | None = None
        self._seen = 0  # messages of the conversation the session already holds
        self._last: dict[str, Any] | None = None  # the assistant message returned last
        close_ids = list(renderer.close.ids)
        # Stop on the template's end-of-turn token as well as the model's EOS.
        self._stop_ids = close_ids if len(close_ids) == 1 else None

    def token_trace(self) -> TokenTrace | None:
        return self._session.trace() if self._session is not None else None

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], options: TurnOptions
    ) -> ModelTurn:
        try:
            close_id = self._stop_ids[0] if self._stop_ids else None
            grammar = tool_choice_grammar(self._parser, tools, options.tool_choice, close_id)
        except ValueError as exc:  # a config error, the same for every rollout: it stops the command
            raise ModelRequestError(str(exc)) from None
        prompt = self._prompt(messages, tools)
        budget = context_budget(
            len(prompt), options.max_tokens or self.config.default_max_tokens, self.config.max_context_tokens
        )
        generation = await self.server.generate(
            prompt,
            max_tokens=budget,
            temperature=options.temperature,
            stop_token_ids=self._stop_ids,
            seed=self.config.seed,
            grammar=grammar,
        )
        turn = self._turn(generation.token_ids, generation.finish_reason, tools)
        turn.usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(generation.token_ids),
            "total_tokens": len(prompt) + len(generation.token_ids),
        }
        assert self._session is not None
        message = turn.as_message()
        self._session.add_generation(generation.token_ids, generation.logprobs, message)
        self._seen = len(messages) + 1
        self._last = message
        return turn

    def _prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """The held ids to send (the session's own list: not copied, so a turn costs the same late as early)."""
        if self._session is None:
            self._session = TokenSession(self.renderer, tools)
            self._seen = len(messages)
            return self._session.start(messages)
        if len(messages) <= self._seen or messages[self._seen - 1] != self._last:
            raise RuntimeError(
                "TokenChatModel: the conversation was not continued from the last assistant turn "
                "(earlier messages changed); use one TokenChatModel per trajectory and only append messages"
            )
        new = messages[self._seen :]
        return self._session.extend(new)

    def _turn(self, ids: list[int], finish_reason: str, tools: list[dict[str, Any]]) -> ModelTurn:
        text = self.renderer.decode(ids)
        close = self.renderer.close.text
        if text.endswith(close):
            text = text[: -len(close)]
        eos = getattr(self.renderer.tokenizer, "eos_token", None)
        if eos and text.endswith(eos):
            text = text[: -len(eos)]
        reasoning = None
        if self.config.split_reasoning and "</think>" in text:
            head, _, text = text.partition("</think>")
            reasoning = head.split("<think>", 1)[-1].strip("\n")
            text = text.lstrip("\n")
        turn = turn_from_text(self._parser, text, tools, reasoning=reasoning, finish_reason=finish_reason)
        turn.content = turn.content or ""  # the session holds the assistant message as the template renders it
        return turn


def context_budget(prompt_tokens: int, max_tokens: int, max_context_tokens: int | None) -> int:
    """Tokens a turn may sample: `max_tokens`, cut to the room the context leaves after the prompt."""
    if max_context_tokens is None:
        return max_tokens
    room = max_context_tokens - prompt_tokens
    if room <= 0:
        # The loop reads this as context_full: the model's conversation, not a broken server.
        raise ModelError(
            f"context length exceeded: the prompt holds {prompt_tokens} tokens, max_context_tokens is "
            f"{max_context_tokens}",
            retryable=False,
        )
    return min(max_tokens, room)
