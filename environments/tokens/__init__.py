"""Exact token ids for trainers (Phase 2): local chat-template rendering, an append-only
token session, token-level server clients and a `ChatModel` built on them."""

from .session import NOT_SAMPLED, Span, TokenSequence, TokenSession, TokenTrace
from .template import ChatRenderer, TemplateError, TurnClose

__all__ = [
    "NOT_SAMPLED",
    "ChatRenderer",
    "Span",
    "TemplateError",
    "TokenSequence",
    "TokenSession",
    "TokenTrace",
    "TurnClose",
]
