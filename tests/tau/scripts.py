"""Scripted parts of a τ² conversation, shared by the env and scoring tests: a customer (that of bundled
retail task 1 by default), an agent for the real loop, and an agent replayed straight on a domain's tools."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from typing import Any

from environments.models.base import ModelTurn
from environments.tau.domain import Domain
from environments.tau.scoring import TauScore, score_episode
from environments.tau.tasks import Task

OPENING = "Hello, the keyboard of my order W1000002 should have clicky switches instead."
CONFIRM = "Yes, please go ahead with that."


def customer(opening: str, confirm: str = CONFIRM) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A customer who opens with `opening`, confirms once, then stops; by position in the dialogue
    (stateless: rollouts interleave)."""

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        assert body["messages"][0]["role"] == "system" and "<scenario>" in body["messages"][0]["content"]
        assert not body.get("tools")  # the simulator is offered no tools
        said = len(body["messages"]) // 2  # system + (agent, user) pairs + the agent's last words
        if said == 1:
            assert body["messages"][1]["content"] == "Hi! How can I help you today?"
            return {"content": opening}
        if said == 2:
            return {"content": confirm}
        return {"content": "Great, thanks! ###STOP###"}

    return reply


scripted_user = customer(OPENING)  # the customer of bundled retail task 1


class ScriptedAgent:
    """Plays ("call", name, args) and ("say", text) steps, one per model call."""

    def __init__(self, steps: list[tuple[str, Any, Any]]) -> None:
        self.steps = list(steps)
        self.tool_results: list[str] = []

    async def chat(self, messages, tools, options) -> ModelTurn:
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


def play(domain: Domain, db: dict[str, Any], steps: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Messages of an agent that runs each ("call", (name, args)) on `db` and says each ("say", text)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi, I need help"}]
    for n, (kind, what) in enumerate(steps):
        if kind == "say":
            messages.append({"role": "assistant", "content": what})
            messages.append({"role": "user", "content": "ok"})
            continue
        name, args = what
        try:
            result = json.dumps(domain.call(db, name, args))
        except ValueError as exc:
            result = json.dumps({"error": str(exc)})
        tool_call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [tool_call]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "name": name, "content": result})
    return messages


def gold_steps(task: Task) -> list[tuple[str, Any]]:
    assert task.evaluation_criteria is not None and task.evaluation_criteria.actions is not None
    return [("call", (a.name, a.arguments)) for a in task.evaluation_criteria.actions]


def run(
    domain: Domain, task: Task, base: dict[str, Any], steps: list[tuple[str, Any]], ended: str = "user_stop"
) -> TauScore:
    """Score `steps` played on a fresh copy of `base` (the domain's database)."""
    db = domain.load_db(copy.deepcopy(base))
    start = copy.deepcopy(db)
    messages = play(domain, db, steps)
    return score_episode(task, domain, start, db, messages, ended=ended)
