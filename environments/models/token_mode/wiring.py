"""Token-mode wiring for the runtime: which servers are token servers, and their models.

Chat mode (an OpenAI chat endpoint) cannot say which token ids the model sampled; the env
then re-renders finished conversations and sends no inference logprobs. Token mode talks to a
token server (`--env.token_server`, or `--openai.server_type vllm|sglang`) through
`TokenChatModel`, and each rollout's groups carry the exact ids, masks and logprobs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal, cast

from .chat_model import TokenChatConfig, TokenChatModel
from .servers import HTTPTokenServer, TokenServerConfig, TokenServerKind, make_token_server
from .session import TokenTrace
from .template import ChatRenderer

__all__ = ["TokenServerChoice", "CHAT_MODE_NOTE", "resolve_token_server", "TokenModeModels", "trace_items"]

logger = logging.getLogger(__name__)

# atroposlib server types that speak a token protocol (for `auto`).
_AUTO_KIND: dict[str, TokenServerKind] = {"vllm": "vllm", "sglang": "sglang"}

TokenServerChoice = Literal["auto", "off", "vllm", "vllm_openai", "sglang", "llamacpp"]

CHAT_MODE_NOTE = (
    "chat mode: {url} is used as an OpenAI chat endpoint, which cannot give the exact token ids the "
    "model sampled; tokens and masks are re-rendered from the messages and no inference_logprobs "
    "are sent. For exact tokens point at a token server with --env.token_server "
    "vllm|vllm_openai|sglang|llamacpp."
)


def resolve_token_server(choice: str, server_type: str, embedded: bool = False) -> TokenServerKind | None:
    """`auto`: atroposlib's `vllm`/`sglang` server types speak token protocols, and so does the
    embedded llama.cpp server; another `openai` endpoint does not."""
    if choice == "off":
        return None
    if choice == "auto":
        if embedded:
            return "llamacpp"
        return _AUTO_KIND.get(server_type)
    return cast(TokenServerKind, choice)  # every other choice is the name of a kind


class TokenModeModels:
    """One token-server client per model server, one renderer; a fresh model per trajectory."""

    def __init__(
        self,
        servers: list[TokenServerConfig],
        tokenizer: Any,
        chat_template_path: str | None,
        chat_config: TokenChatConfig,
    ) -> None:
        template = Path(chat_template_path).read_text() if chat_template_path else None
        self.renderer = ChatRenderer(tokenizer, template)
        self.chat_config = chat_config
        self.clients: list[HTTPTokenServer] = [make_token_server(server) for server in servers]

    async def check(self) -> None:
        for client in self.clients:
            await client.check()

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()

    def make_model(self, index: int) -> TokenChatModel:
        return TokenChatModel(self.clients[index], self.renderer, self.chat_config)


def trace_items(trace: TokenTrace) -> list[tuple[list[int], list[int], list[float]]]:
    """(tokens, masks, inference_logprobs) per sequence, for a ScoredDataGroup.

    A trace has more than one sequence only where the template was not append-only; each is
    a valid training item. Template tokens after a sequence's last sampled token (a turn that
    never ran because the context was full) carry no signal and would only push the item
    over the trainer's length, so they are cut; a sequence without sampled tokens is skipped.
    """
    if trace.restarts:
        logger.info("rollout split into %d token sequences: %s", len(trace.sequences), "; ".join(trace.restart_reasons))
    items = []
    for seq in trace.sequences:
        model_spans = [s for s in seq.spans if s.kind == "model" and s.end > s.start]
        if not model_spans:
            continue
        end = model_spans[-1].end
        items.append((seq.tokens[:end], seq.masks[:end], seq.inference_logprobs[:end]))
    return items
