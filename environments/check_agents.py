"""Deterministic `ChatModel`s for checking an env: an oracle that runs one known-good terminal command,
and an agent that does nothing. The SWE-smith and terminal-task oracles differ only in the command."""

from __future__ import annotations

import json
from typing import Any

from environments.models.base import ModelTurn

__all__ = ["NoOpAgent", "OneCallOracle"]


class OneCallOracle:
    """Answers the task's first prompt with one terminal call, then finishes once it sees the result.

    Subclasses say what they did (`done`), what they answer a task they do not know (`unknown`), and
    give the terminal call's arguments for a user prompt (`arguments`; None for an unknown task).
    """

    done = "Done."
    unknown = "I do not know this task."

    def arguments(self, prompt: str) -> dict[str, Any] | None:
        raise NotImplementedError

    async def chat(self, messages, tools, options) -> ModelTurn:
        if any(m.get("role") == "tool" for m in messages):
            return ModelTurn(content=self.done, finish_reason="stop")
        prompt = next(m["content"] for m in messages if m.get("role") == "user")
        args = self.arguments(prompt)
        if args is None:
            return ModelTurn(content=self.unknown, finish_reason="stop")
        call = {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": json.dumps(args)}}
        return ModelTurn(content=None, tool_calls=[call], finish_reason="tool_calls")


class NoOpAgent:
    """Answers at once without touching anything."""

    async def chat(self, messages, tools, options) -> ModelTurn:
        return ModelTurn(content="Nothing to do.", finish_reason="stop")
