"""Deterministic stand-ins for tests and benchmarks of the token path (no model, no server).

`tool_conversation` scripts a long tool-using conversation; `template_completion` gives the
ids a model that follows its template exactly would generate for an assistant message.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from .template import ChatRenderer

__all__ = ["ScriptedTurn", "TOOLS", "tool_conversation", "template_completion"]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a Python snippet and return its stdout.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file from the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
]


@dataclass
class ScriptedTurn:
    assistant: dict[str, Any]  # what the model "says" this turn
    then: list[dict[str, Any]]  # tool results (and sometimes a user reply) that follow


def tool_conversation(
    turns: int, *, seed: int = 0, reasoning: bool = False, user_every: int = 0, parallel: bool = True
) -> tuple[list[dict[str, Any]], list[ScriptedTurn]]:
    """A system + user opening and `turns` assistant turns with tool calls and results.

    Text includes non-ASCII, JSON-ish and whitespace edge cases. Every `user_every` turns
    (0: never) a user reply follows the tool results. `parallel=False` keeps one call per
    turn (Llama 3.1's template refuses more).
    """
    rng = random.Random(seed)
    opening = [
        {"role": "system", "content": "You are a careful agent. Use tools; answer briefly."},
        {"role": "user", "content": "Compute the totals in data.csv — and explain (ünïcode, 日本語)."},
    ]
    script: list[ScriptedTurn] = []
    for i in range(turns):
        n_calls = 2 if parallel and rng.random() < 0.3 else 1
        calls: list[dict[str, Any]] = []
        for j in range(n_calls):
            if rng.random() < 0.5:
                name, args = "python", {"code": f"print(sum(range({rng.randint(1, 999)})))  # turn {i}"}
            else:
                name, args = "read_file", {"path": f"data/part_{i}_{j}.csv"}
            calls.append(
                {
                    "id": f"call{i:03d}{j}xyz"[:9],
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            )
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": f"Step {i}: checking {'both' if n_calls > 1 else 'one'} thing(s).",
        }
        if reasoning:
            msg["reasoning_content"] = f"I should look at part {i}; {rng.random():.3f} of the way."
        msg["tool_calls"] = calls
        then: list[dict[str, Any]] = [
            {
                "role": "tool",
                "tool_call_id": c["id"],
                "name": c["function"]["name"],
                "content": f"result {i}.{j}: {rng.randint(0, 10**6)}\n  trailing  ",
            }
            for j, c in enumerate(calls)
        ]
        if user_every and (i + 1) % user_every == 0:
            then.append({"role": "user", "content": f"Thanks. Now continue with part {i + 1}."})
        script.append(ScriptedTurn(msg, then))
    return opening, script


def template_completion(
    renderer: ChatRenderer, history: list[dict[str, Any]], assistant: dict[str, Any], tools: list[dict[str, Any]] | None
) -> list[int]:
    """The ids of `assistant` exactly as the template renders it after `history`'s generation
    prompt, up to and including the end-of-turn marker: what a well-trained model emits."""
    prompt = renderer.render(history, tools, add_generation_prompt=True)
    full = renderer.render(history + [assistant], tools, add_generation_prompt=False)
    if not full.startswith(prompt):
        raise ValueError("the template renders the assistant turn differently from its generation prompt")
    segment = full[len(prompt) :]
    end = segment.rfind(renderer.close.text)
    if end < 0:
        raise ValueError("no end-of-turn marker after the assistant turn")
    return renderer.encode(segment[: end + len(renderer.close.text)])
