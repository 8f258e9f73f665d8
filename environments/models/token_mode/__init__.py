"""Exact token ids for trainers (token mode): local chat-template rendering, an append-only
token session, token-level server clients and a `ChatModel` built on them."""

from .chat_model import TokenChatConfig, TokenChatModel
from .servers import Generation, HTTPTokenServer, TokenServer, TokenServerConfig, TokenServerKind, make_token_server
from .session import NOT_SAMPLED, Span, TokenSequence, TokenSession, TokenTrace
from .template import ChatRenderer, TemplateError, TurnClose

__all__ = [
    "NOT_SAMPLED",
    "ChatRenderer",
    "Generation",
    "HTTPTokenServer",
    "Span",
    "TemplateError",
    "TokenChatConfig",
    "TokenChatModel",
    "TokenSequence",
    "TokenServer",
    "TokenServerConfig",
    "TokenServerKind",
    "TokenSession",
    "TokenTrace",
    "TurnClose",
    "make_token_server",
]
