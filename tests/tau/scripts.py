"""Scripted parts of a τ² conversation, shared by the env tests: the customer of bundled task 1 and an agent."""

from __future__ import annotations

import json
import uuid
from typing import Any

from environments.models.base import ModelTurn

OPENING = "Hello, the keyboard of my order W1000002 should have clicky switches instead."
CONFIRM = "Yes, please go ahead with that."


def scripted_user(body: dict[str, Any]) -> dict[str, Any]:
    """The customer of bundled task 1, by position in the dialogue (stateless: rollouts interleave)."""
    assert body["messages"][0]["role"] == "system" and "<scenario>" in body["messages"][0]["content"]
    assert not body.get("tools")  # the simulator is offered no tools
    said = len(body["messages"]) // 2  # system + (agent, user) pairs + the agent's last words
    if said == 1:
        assert body["messages"][1]["content"] == "Hi! How can I help you today?"
        return {"content": OPENING}
    if said == 2:
        return {"content": CONFIRM}
    return {"content": "Great, thanks! ###STOP###"}


class ScriptedAgent:
    """Plays ("call", name, args) and ("say", text) steps, one per model call."""

    def __init__(self, steps: list[tuple[str, Any, Any]]) -> None:
        self.steps = list(steps)
        self.tool_results: list[str] = []

    async def chat(self, messages, tools, *, temperature, max_tokens) -> ModelTurn:
        if messages[-1]["role"] == "tool":
            self.tool_results.append(messages[-1]["content"])
        kind, a, b = self.steps.pop(0)
        if kind == "say":
            return ModelTurn(content=a)
        call = {
            "id": f"c{uuid.uuid4().hex[:6]}",
            "type": "function",
            "function": {"name": a, "arguments": json.dumps(b)},
        }
        return ModelTurn(content=None, tool_calls=[call])


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:8]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
