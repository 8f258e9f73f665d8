"""The multi-turn agent loop: ask the model, run its tool calls, repeat, stop.

One rollout ends with a reason (finished, max_turns, time_budget, context_full,
model_error); a failing model server ends the rollout as data instead of raising,
so the env can tell an infrastructure failure from a bad answer.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from environments.models.base import ChatModel, ModelError, ModelRequestError, ModelTurn
from model_tools import default_registry
from tools.context import ToolContext
from tools.executor import ToolInfrastructureError
from tools.registry import ToolRegistry

__all__ = ["AgentLoopConfig", "AgentResult", "HermesAgentLoop", "ToolErrorRecord", "TurnRecord", "StopReason"]

StopReason = Literal[
    "finished", "max_turns", "time_budget", "context_full", "model_error", "model_timeout", "infrastructure_error"
]
# Reasons that say nothing about the model's ability: such rollouts are not training signal.
INFRASTRUCTURE_STOPS: frozenset[str] = frozenset({"model_error", "model_timeout", "infrastructure_error"})


class AgentLoopConfig(BaseModel):
    max_turns: int = Field(8, ge=1, description="Model calls per trajectory")
    time_budget_s: float = Field(300.0, gt=0, description="Wall-clock budget of one trajectory")
    temperature: float = Field(0.7, ge=0)
    max_tokens: int | None = Field(512, ge=1, description="Cap on tokens per model turn")
    model_timeout_s: float = Field(
        600.0, gt=0, description="A model call that takes longer is a server that does not answer (infrastructure)"
    )


@dataclass
class TurnRecord:
    index: int
    model_s: float
    tools_s: float
    tool_calls: list[str]  # tool names, in call order
    finish_reason: str | None
    usage: dict[str, int] | None
    calls_from_text: bool = False
    parse_errors: list[str] = field(default_factory=list)


@dataclass
class ToolErrorRecord:
    turn: int
    tool: str
    arguments: str
    error: str


@dataclass
class AgentResult:
    messages: list[dict[str, Any]]
    turns_used: int
    finished_naturally: bool
    stop_reason: StopReason
    turns: list[TurnRecord]
    tool_errors: list[ToolErrorRecord]
    error: str | None = None
    duration_s: float = 0.0

    @property
    def final_response(self) -> str | None:
        for msg in reversed(self.messages):
            if msg.get("role") == "assistant":
                return msg.get("content")
        return None

    @property
    def infrastructure_failure(self) -> bool:
        return self.stop_reason in INFRASTRUCTURE_STOPS

    @property
    def tool_call_count(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)


def _error_of(result: str) -> str | None:
    """The `error` field of a tool's JSON answer, if it has one."""
    if not result.startswith("{"):
        return None
    try:
        payload = json.loads(result)
    except json.JSONDecodeError:
        return None
    err = payload.get("error") if isinstance(payload, dict) else None
    return str(err) if err else None


def _is_context_overflow(message: str) -> bool:
    text = message.lower()
    return "context" in text and ("length" in text or "exceed" in text or "too long" in text)


class HermesAgentLoop:
    def __init__(
        self,
        model: ChatModel,
        tools: list[dict[str, Any]],
        context: ToolContext,
        config: AgentLoopConfig | None = None,
        registry: ToolRegistry | None = None,
    ) -> None:
        self.model = model
        self.tools = tools
        self.context = context
        self.config = config or AgentLoopConfig()
        self.registry = registry or default_registry()
        self._allowed = [t["function"]["name"] for t in tools]

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult:
        messages = list(messages)
        turns: list[TurnRecord] = []
        tool_errors: list[ToolErrorRecord] = []
        started = time.monotonic()
        deadline = started + self.config.time_budget_s

        def done(reason: StopReason, error: str | None = None) -> AgentResult:
            return AgentResult(
                messages=messages,
                turns_used=len(turns),
                finished_naturally=reason == "finished",
                stop_reason=reason,
                turns=turns,
                tool_errors=tool_errors,
                error=error,
                duration_s=time.monotonic() - started,
            )

        for index in range(self.config.max_turns):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return done("time_budget")
            t0 = time.monotonic()
            try:
                # Bounded by the request timeout, not the budget: a slow but answering server gives a
                # scored trajectory (the budget is checked before the next step); a silent one is
                # an infrastructure failure, never a 0 for the model.
                turn: ModelTurn = await asyncio.wait_for(
                    self.model.chat(
                        messages, self.tools, temperature=self.config.temperature, max_tokens=self.config.max_tokens
                    ),
                    self.config.model_timeout_s,
                )
            except asyncio.TimeoutError:
                return done("model_timeout", f"the model server did not answer within {self.config.model_timeout_s:.0f}s")
            except ModelError as exc:
                if _is_context_overflow(str(exc)):
                    return done("context_full", str(exc))
                if isinstance(exc, ModelRequestError):
                    raise  # a 4xx: the request is wrong for every rollout; the env stops the command
                return done("model_error", str(exc))
            model_s = time.monotonic() - t0
            for call in turn.tool_calls:
                call.setdefault("id", f"call_{uuid.uuid4().hex[:12]}")
                call.setdefault("type", "function")
            messages.append(turn.as_message())
            record = TurnRecord(
                index=index,
                model_s=model_s,
                tools_s=0.0,
                tool_calls=[c["function"]["name"] for c in turn.tool_calls],
                finish_reason=turn.finish_reason,
                usage=turn.usage,
                calls_from_text=turn.calls_from_text,
                parse_errors=list(turn.parse_errors),
            )
            turns.append(record)
            if not turn.tool_calls:
                return done("finished")

            t1 = time.monotonic()
            try:
                results = await self._run_calls(turn.tool_calls, deadline - t1)
            except ToolInfrastructureError as exc:
                record.tools_s = time.monotonic() - t1
                return done("infrastructure_error", str(exc))
            record.tools_s = time.monotonic() - t1
            out_of_time = results is None
            for i, call in enumerate(turn.tool_calls):
                result = (
                    json.dumps({"error": "the trajectory's time budget ran out before this call finished"})
                    if results is None
                    else results[i]
                )
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"], "content": result}
                )
                if err := _error_of(result):
                    tool_errors.append(
                        ToolErrorRecord(index, call["function"]["name"], str(call["function"].get("arguments")), err)
                    )
            if out_of_time:
                return done("time_budget")
        return done("max_turns")

    async def _run_calls(self, calls: list[dict[str, Any]], remaining: float) -> list[str] | None:
        """All calls of one turn run concurrently; results come back in call order."""
        if remaining <= 0:
            return None
        jobs = [
            self.registry.call(c["function"]["name"], c["function"].get("arguments"), self.context, self._allowed)
            for c in calls
        ]
        try:
            return list(await asyncio.wait_for(asyncio.gather(*jobs), remaining))
        except asyncio.TimeoutError:
            return None
