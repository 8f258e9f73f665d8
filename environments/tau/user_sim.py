"""The user simulator and the NL-assertion judge: each its own OpenAI-compatible model.

The simulator plays the task's customer: its system prompt is the benchmark's user guidelines
(`user_simulator/simulation_guidelines.md`) followed by the task's scenario in `<scenario>`
tags, as the benchmark builds it. It sees only what the agent *says* (never tool calls or
results), with roles flipped: the agent's words are its `user` turns, its own are `assistant`.
A reply containing ###STOP###, ###TRANSFER### or ###OUT-OF-SCOPE### ends the conversation.

Its requests go to its own server (`--env.user_model.*`, by default the embedded llama.cpp server
the env starts) through a chat client, never through the agent's model client: its tokens are
not the policy's and never enter a trained sequence.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field

from environments.models.base import ChatModel, TurnOptions
from environments.runtime import EMBEDDED, EMBEDDED_MODEL_NAME

__all__ = [
    "GREETING",
    "STOP_TOKENS",
    "JudgeConfig",
    "UserModelConfig",
    "UserSimulator",
    "judge_nl_assertions",
    "stop_token",
]

# The agent's fixed opening line: the user simulator answers it; it is not the policy's output.
GREETING = "Hi! How can I help you today?"
STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")


class UserModelConfig(BaseModel):
    base_url: str = Field(
        EMBEDDED, description="The user simulator's OpenAI-compatible server; 'embedded': the env's embedded server"
    )
    model: str = Field(EMBEDDED_MODEL_NAME, description="Model name sent to the user simulator's server")
    api_key: str | None = Field(None, repr=False, description="API key of the user simulator's server")
    temperature: float = Field(0.0, ge=0, description="The user simulator's sampling temperature")
    seed: int | None = Field(0, description="Sampling seed sent with each request (None: none sent)")
    max_tokens: int = Field(256, ge=1, description="Cap on tokens per simulated user turn")
    timeout_s: float = Field(120.0, gt=0, description="Timeout of one user simulator request")
    max_retries: int = Field(2, ge=0, description="Retries of a failed user simulator request (5xx, 429, connection)")
    max_user_turns: int | None = Field(
        None,
        ge=1,
        description="Deliberate difference: cut a conversation off after this many user turns (None: no cap)",
    )


class JudgeConfig(BaseModel):
    base_url: str | None = Field(None, description="OpenAI-compatible server judging NL assertions (None: no judge)")
    model: str = Field(EMBEDDED_MODEL_NAME, description="The judge's model name")
    api_key: str | None = Field(None, repr=False, description="API key of the judge's server")
    timeout_s: float = Field(120.0, gt=0)


def stop_token(text: str | None) -> str | None:
    """The stop token in a simulated user's reply, if any."""
    return next((t for t in STOP_TOKENS if text and t in text), None)


class UserSimulator:
    """One conversation's simulated user (create one per conversation: it holds the dialogue)."""

    def __init__(self, model: ChatModel, guidelines: str, scenario: str, config: UserModelConfig) -> None:
        self.model = model
        self.config = config
        self.system = f"{guidelines.strip()}\n\n<scenario>\n{scenario}\n</scenario>"
        self.dialogue: list[dict[str, Any]] = []  # the simulator's own view, roles flipped
        self.calls = 0

    async def reply(self, agent_says: str) -> str:
        """The user's answer to what the agent said (a ModelError when its server fails)."""
        self.dialogue.append({"role": "user", "content": agent_says})
        self.calls += 1
        turn = await self.model.chat(
            [{"role": "system", "content": self.system}, *self.dialogue],
            [],
            TurnOptions(self.config.temperature, self.config.max_tokens),
        )
        text = (turn.content or "").strip()
        self.dialogue.append({"role": "assistant", "content": text})
        return text


_JUDGE_SYSTEM = (
    "You grade a customer service conversation against a list of expected outcomes. Judge each "
    "outcome on its own, from the conversation only. Answer with JSON only, of the form "
    '{"results": [{"expectedOutcome": "<the outcome>", "reasoning": "<short>", "metExpectation": true}]} '
    "with one result per expected outcome, in the given order."
)


async def judge_nl_assertions(model: ChatModel, messages: list[dict[str, Any]], assertions: list[str]) -> list[bool]:
    """One verdict per assertion from the judge model; an outcome it does not grade counts as not met."""
    lines = [
        f"{m['role']}: {m['content']}"
        for m in messages
        if m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str) and m["content"]
    ]
    prompt = "conversation:\n" + "\n".join(lines) + "\n\nexpectedOutcomes:\n" + json.dumps(assertions)
    turn = await model.chat(
        [{"role": "system", "content": _JUDGE_SYSTEM}, {"role": "user", "content": prompt}],
        [],
        TurnOptions(temperature=0.0, max_tokens=1024),
    )
    match = re.search(r"\{.*\}", turn.content or "", re.DOTALL)
    try:
        results = json.loads(match.group(0))["results"] if match else []
    except (json.JSONDecodeError, KeyError, TypeError):
        results = []
    verdicts = [False] * len(assertions)
    for i, r in enumerate(results if isinstance(results, list) else []):
        if i < len(verdicts) and isinstance(r, dict):
            verdicts[i] = r.get("metExpectation") is True
    return verdicts
