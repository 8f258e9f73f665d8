"""A smolagents `Model` backed by the project's model clients, capturing every call as it happens.

smolagents re-renders its memory for every step (it strips outputs, adds "Calling tools:",
planning and final-answer prompts), so the next prompt is not the previous prompt plus the
sampled tokens. Each call is therefore its own token sequence: the prompt as rendered by the
chat template, then exactly the ids the server sampled, with their logprobs. The trace hands
the trainer one sequence per model call (`TokenTrace` with one restart per later call, the
policy main's group building already applies to split rollouts).

Stop strings are applied here, not by the server: the generated ids are cut right after the
first token that completes one. smolagents gets what an API with `stop` returns, the text before
the stop string (it then appends `</code>` itself, as upstream); the token sequence and the
transcript keep what the model wrote, stop string included. Ids after the cut were sampled but
are not part of the turn; they are never trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smolagents.models import ChatMessage, MessageRole, Model, get_clean_message_list, tool_role_conversions
from smolagents.monitoring import TokenUsage

from environments.models.base import ChatModel, TurnOptions
from environments.models.token_mode.chat_model import context_budget, TokenChatModel
from environments.models.token_mode.session import TokenSequence, TokenTrace

from .executor import Bridge

__all__ = ["CapturingModel", "ModelCall", "before_stop", "cut_at_stop", "plain_messages"]

SPLIT_REASON = "smolagents re-renders its memory for every model call: one token sequence per call"


@dataclass
class ModelCall:
    messages: list[dict[str, Any]]  # the prompt, as OpenAI-style messages
    text: str  # what the model wrote (stop string included)
    sequence: TokenSequence | None  # token mode: prompt ids + sampled ids and logprobs
    finish_reason: str | None
    usage: dict[str, int] | None


def plain_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """smolagents' messages as chat-template messages: tool calls and responses as assistant/user text."""
    clean = get_clean_message_list(messages, role_conversions=tool_role_conversions, flatten_messages_as_text=True)
    return [{"role": str(getattr(m["role"], "value", m["role"])), "content": m["content"]} for m in clean]


def first_stop(text: str, stops: list[str]) -> int | None:
    """End of the earliest stop string in `text` (None: none occurs)."""
    ends = [i + len(s) for s in stops if s and (i := text.find(s)) >= 0]
    return min(ends) if ends else None


def before_stop(text: str, stops: list[str]) -> str:
    """`text` up to the earliest stop string, which is left out (what an API given `stop` returns)."""
    starts = [i for s in stops if s and (i := text.find(s)) >= 0]
    return text[: min(starts)] if starts else text


def cut_at_stop(decode: Any, ids: list[int], stops: list[str]) -> int:
    """How many of `ids` to keep: up to and including the token that completes the first stop string."""
    if not stops or first_stop(decode(ids), stops) is None:
        return len(ids)
    lo, hi = 1, len(ids)  # the smallest prefix whose text holds a stop string (monotone in the prefix)
    while lo < hi:
        mid = (lo + hi) // 2
        if first_stop(decode(ids[:mid]), stops) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


class CapturingModel(Model):
    """One trajectory's smolagents model: chat mode through any `ChatModel`, token mode through its token server."""

    def __init__(self, chat_model: ChatModel, bridge: Bridge, *, temperature: float, max_tokens: int, timeout_s: float):
        super().__init__(model_id="hermes-rl")
        self.chat_model = chat_model
        self.bridge = bridge
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.calls: list[ModelCall] = []
        inner = getattr(chat_model, "inner", chat_model)  # BoundedModel wraps the client with its server's gate
        self.token_model: TokenChatModel | None = inner if isinstance(inner, TokenChatModel) else None
        self.gate = getattr(chat_model, "gate", None)

    @property
    def supports_stop_parameter(self) -> bool:
        return True  # applied in generate

    def generate(
        self,
        messages: list[Any],
        stop_sequences: list[str] | None = None,
        response_format: dict[str, str] | None = None,
        tools_to_call_from: list[Any] | None = None,
        **kwargs: Any,
    ) -> ChatMessage:
        if response_format is not None or tools_to_call_from:
            raise ValueError("CapturingModel writes code actions as text: no response_format, no tools_to_call_from")
        prompt = plain_messages(messages)
        stops = list(stop_sequences or [])
        if self.token_model is not None:
            call = self.bridge.run(lambda: self._token_call(prompt, stops), self.timeout_s)
        else:
            call = self.bridge.run(lambda: self._chat_call(prompt, stops), self.timeout_s)
        self.calls.append(call)
        usage = call.usage or {}
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            content=before_stop(call.text, stops),
            raw={"text": call.text},  # smolagents may edit `content` in its memory; `raw` keeps what was written
            token_usage=TokenUsage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
        )

    async def _chat_call(self, prompt: list[dict[str, Any]], stops: list[str]) -> ModelCall:
        turn = await self.chat_model.chat(prompt, [], TurnOptions(self.temperature, self.max_tokens))
        text = turn.content or ""
        end = first_stop(text, stops)
        return ModelCall(prompt, text[:end] if end is not None else text, None, turn.finish_reason, turn.usage)

    async def _token_call(self, prompt: list[dict[str, Any]], stops: list[str]) -> ModelCall:
        model = self.token_model
        assert model is not None
        renderer = model.renderer
        ids = renderer.encode(renderer.render(prompt, None, add_generation_prompt=True))
        budget = context_budget(len(ids), self.max_tokens, model.config.max_context_tokens)
        close = list(renderer.close.ids)
        stop_ids = close if len(close) == 1 else None

        async def sample() -> Any:
            return await model.server.generate(
                ids, max_tokens=budget, temperature=self.temperature, stop_token_ids=stop_ids, seed=model.config.seed
            )

        if self.gate is not None:
            async with self.gate:
                generation = await sample()
        else:
            generation = await sample()
        keep = cut_at_stop(renderer.decode, generation.token_ids, stops)
        sampled = generation.token_ids[:keep]
        sequence = TokenSequence()
        sequence.append("prompt", ids)
        sequence.append("model", sampled, generation.logprobs[:keep])
        text = renderer.decode(sampled)
        for marker in (renderer.close.text, getattr(renderer.tokenizer, "eos_token", None)):
            if marker and text.endswith(marker):
                text = text[: -len(marker)]
        finish = "stop" if keep < len(generation.token_ids) else generation.finish_reason
        usage = {"prompt_tokens": len(ids), "completion_tokens": keep, "total_tokens": len(ids) + keep}
        return ModelCall(prompt, text, sequence, finish, usage)

    def token_trace(self) -> TokenTrace | None:
        """Token mode: one sequence per model call, in call order (None in chat mode)."""
        sequences = [c.sequence for c in self.calls if c.sequence is not None]
        if self.token_model is None or not sequences:
            return None
        for sequence in sequences:
            sequence.verify()
        restarts = len(sequences) - 1
        return TokenTrace(sequences, restarts, [SPLIT_REASON] * restarts, 0)
