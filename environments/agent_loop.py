"""The multi-turn agent loop: ask the model, run its tool calls, repeat, stop.

One rollout ends with a reason (finished, max_turns, time_budget, context_full,
model_error); a failing model server ends the rollout as data instead of raising,
so the env can tell an infrastructure failure from a bad answer.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from random import getrandbits
from typing import Any, Literal

from pydantic import BaseModel, Field

from environments.models.base import ChatModel, ModelError, ModelRequestError, ModelTurn, TurnOptions
from environments.models.tool_choice import ToolChoice
from environments.watchdog import Watchdog
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
    tool_choice: ToolChoice = Field(
        "auto",
        description="OpenAI tool_choice of every turn: auto | none | required | '{type: function, function: "
        "{name: NAME}}' (chat mode: sent to the server; token mode: a llama.cpp grammar; docs/environments.md)",
    )
    first_turn_tool_choice: ToolChoice | None = Field(
        None,
        description="tool_choice of the first turn; None: required when the embedded model serves in token mode (a "
        "135M model seldom calls a tool unprompted, so its rollouts would show no tool use), else as tool_choice",
    )

    def turn_tool_choice(self, index: int) -> ToolChoice:
        if index == 0 and self.first_turn_tool_choice is not None:
            return self.first_turn_tool_choice
        return self.tool_choice


@dataclass(slots=True)  # slots: tens of thousands of trajectories keep ten of these each
class TurnRecord:
    index: int
    model_s: float
    tools_s: float
    # Tool names, in call order. A tuple of strings: CPython untracks it at its first young collection,
    # so the middle and full collections never walk it (tens of thousands of trajectories keep ten each).
    tool_calls: tuple[str, ...]
    finish_reason: str | None
    usage: dict[str, int] | None
    calls_from_text: bool = False
    # A tuple: the usual empty one is shared and untracked, where a list per turn is one more object for the collector.
    parse_errors: tuple[str, ...] = ()


@dataclass(slots=True)
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


_OUT_OF_TIME = json.dumps({"error": "the trajectory's time budget ran out before this call finished"})


def _end(
    messages: list[dict[str, Any]],
    turns: list[TurnRecord],
    tool_errors: list[ToolErrorRecord],
    started: float,
    reason: StopReason,
    error: str | None = None,
) -> AgentResult:
    # A function given the state, not a closure (its cells and function would be six more objects
    # per trajectory) nor a tuple of the state (one more).
    return AgentResult(
        messages=messages,
        turns_used=len(turns),
        finished_naturally=reason == "finished",
        stop_reason=reason,
        turns=turns,
        tool_errors=tool_errors,
        error=error,
        duration_s=asyncio.get_running_loop().time() - started,
    )


def _is_context_overflow(message: str) -> bool:
    text = message.lower()
    return "context" in text and ("length" in text or "exceed" in text or "too long" in text)


class HermesAgentLoop:
    """Runs trajectories; one instance may run many concurrently.

    Built for tens of thousands of concurrent trajectories in one process: the model call and
    the tool calls are bounded by one timer per trajectory (environments/watchdog.py; a timer
    per step was a quarter of the loop's time), a lone tool call is awaited directly (no task), and each turn
    keeps as few objects alive as it can, because every live object is one more the garbage
    collector walks in each full collection.
    """

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
        self._allowed = frozenset(t["function"]["name"] for t in tools)  # built once, not per call

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult:
        messages = list(messages)
        turns: list[TurnRecord] = []
        tool_errors: list[ToolErrorRecord] = []
        # loop.time() is the clock asyncio's timers use; called on the loop, no bound method is kept.
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.config.time_budget_s
        config = self.config
        # Locals, not attributes per turn; bound methods are not kept (each would be an object per trajectory).
        tools, context, allowed = self.tools, self.context, self._allowed
        model_timeout_s = config.model_timeout_s
        first = TurnOptions(config.temperature, config.max_tokens, config.turn_tool_choice(0))
        later = replace(first, tool_choice=config.turn_tool_choice(1))

        # Both limits on one timer per trajectory (environments/watchdog.py), not a timer per step.
        watchdog = Watchdog()
        try:
            for index in range(config.max_turns):
                t0 = loop.time()
                if t0 >= deadline:
                    return _end(messages, turns, tool_errors, started, "time_budget")
                # Bounded by the request timeout, not the budget: a slow but answering server gives a
                # scored trajectory (the budget is checked before the next step); a silent one is
                # an infrastructure failure, never a 0 for the model.
                watchdog.arm(t0 + model_timeout_s)
                try:
                    turn: ModelTurn = await self.model.chat(messages, tools, later if index else first)
                except (asyncio.CancelledError, TimeoutError) as exc:
                    if isinstance(exc, asyncio.CancelledError) and not watchdog.expired():
                        raise  # cancelled from outside: the caller's, not a timeout
                    error = f"the model server did not answer within {model_timeout_s:.0f}s"
                    return _end(messages, turns, tool_errors, started, "model_timeout", error)
                except ModelError as exc:
                    if _is_context_overflow(str(exc)):
                        return _end(messages, turns, tool_errors, started, "context_full", str(exc))
                    if isinstance(exc, ModelRequestError):
                        raise  # a 4xx: the request is wrong for every rollout; the env stops the command
                    return _end(messages, turns, tool_errors, started, "model_error", str(exc))
                t1 = loop.time()
                calls = turn.tool_calls
                for call in calls:
                    if "id" not in call:  # not setdefault: a fresh id per call would be wasted work
                        call["id"] = f"call_{getrandbits(48):012x}"
                    if "type" not in call:
                        call["type"] = "function"
                messages.append(turn.as_message())
                record = TurnRecord(
                    index=index,
                    model_s=t1 - t0,
                    tools_s=0.0,
                    tool_calls=tuple([c["function"]["name"] for c in calls]),
                    finish_reason=turn.finish_reason,
                    usage=turn.usage,
                    calls_from_text=turn.calls_from_text,
                    parse_errors=tuple(turn.parse_errors),
                )
                turns.append(record)
                if not calls:
                    return _end(messages, turns, tool_errors, started, "finished")
                del turn  # not kept alive across the tool calls: one object fewer for the collector
                out_of_time = t1 >= deadline  # the model answered after the deadline: no time for tools
                if not out_of_time:
                    watchdog.arm(deadline)
                    try:
                        if len(calls) == 1:  # the common case needs no task (nor a list) of its own
                            fn = calls[0]["function"]
                            result = await self.registry.call(fn["name"], fn.get("arguments"), context, allowed)
                        else:
                            results = await self._run_calls(calls)
                    except asyncio.CancelledError:
                        if not watchdog.expired():
                            raise
                        out_of_time = True
                    except ToolInfrastructureError as exc:
                        record.tools_s = loop.time() - t1
                        return _end(messages, turns, tool_errors, started, "infrastructure_error", str(exc))
                record.tools_s = loop.time() - t1
                if out_of_time:
                    for call in calls:
                        self._answer(messages, tool_errors, index, call, _OUT_OF_TIME)
                    return _end(messages, turns, tool_errors, started, "time_budget")
                if len(calls) == 1:
                    self._answer(messages, tool_errors, index, calls[0], result)
                else:
                    for call, result in zip(calls, results):
                        self._answer(messages, tool_errors, index, call, result)
            return _end(messages, turns, tool_errors, started, "max_turns")
        finally:
            watchdog.close()

    @staticmethod
    def _answer(
        messages: list[dict[str, Any]],
        tool_errors: list[ToolErrorRecord],
        index: int,
        call: dict[str, Any],
        result: str,
    ) -> None:
        fn = call["function"]
        messages.append({"role": "tool", "tool_call_id": call["id"], "name": fn["name"], "content": result})
        if err := _error_of(result):
            tool_errors.append(ToolErrorRecord(index, fn["name"], str(fn.get("arguments")), err))

    async def _run_calls(self, calls: list[dict[str, Any]]) -> list[str]:
        """Several calls of one turn run concurrently; results come back in call order."""
        call, context, allowed = self.registry.call, self.context, self._allowed
        jobs = (call(c["function"]["name"], c["function"].get("arguments"), context, allowed) for c in calls)
        return await asyncio.gather(*jobs)
