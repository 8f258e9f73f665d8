"""Shared by the batch tests: prompt files and a scripted agent policy for ScriptedOpenAIServer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.scripted_openai import tool_call


def write_prompts(path: Path, prompts: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def agent_policy(failures: dict[str, int] | None = None):
    """Per request: first a python call that prints the prompt's length, then a final answer.

    `failures[prompt]` makes the server answer HTTP 500 that many times for that prompt
    (-1: always), like a server that is down for it.
    """
    failures = failures if failures is not None else {}

    def reply(body: dict[str, Any]):
        messages = body["messages"]
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        left = failures.get(prompt, 0)
        if left:
            failures[prompt] = left - 1 if left > 0 else -1
            return 500
        if messages[-1]["role"] == "user":
            return {"content": None, "tool_calls": [tool_call("python", {"code": f"print(len({prompt!r}))"})]}
        return {"content": f"The answer is {json.loads(messages[-1]['content'])['output'].strip()}"}

    return reply
