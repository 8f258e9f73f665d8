"""The multi-turn agent loop: ask the model, run its tool calls, repeat, stop.

One rollout ends with a reason (finished, max_turns, time_budget, context_full,
model_error); a failing model server ends the rollout as data instead of raising,
so the env can tell an infrastructure failure from a bad answer.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from random import getrandbits
from typing import Any, Literal

from pydantic import BaseModel, Field

from environments.models.base import ChatModel, ModelError, ModelRequestError, ModelTurn
from environments.models.tool_choice import ToolChoice
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
    tool_calls: list[str]  # tool names, in call order
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
    state: tuple[list[dict[str, Any]], list[TurnRecord], list[ToolErrorRecord], float],
    reason: StopReason,
    error: str | None = None,
) -> AgentResult:
    messages, turns, tool_errors, started = state
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
    the tool calls are each bounded by an `asyncio.timeout` (a timer, where `wait_for` made a
    task, a waiter and a timer), a lone tool call is awaited directly (no task), and each turn
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
        clock = asyncio.get_running_loop().time  # time.monotonic, the clock asyncio's timers use
        started = clock()
        deadline = started + self.config.time_budget_s
        config = self.config

        # Ends through _end, not a closure: its cells and function would be six more objects per trajectory.
        done = (messages, turns, tool_errors, started)

        for index in range(config.max_turns):
            t0 = clock()
            if t0 >= deadline:
                return _end(done, "time_budget")
            try:
                # Bounded by the request timeout, not the budget: a slow but answering server gives a
                # scored trajectory (the budget is checked before the next step); a silent one is
                # an infrastructure failure, never a 0 for the model. (A timer, not a task.)
                async with asyncio.timeout(config.model_timeout_s):
                    choice = config.turn_tool_choice(index)
                    # `auto` is not passed: a ChatModel written before tool_choice existed still runs
                    # (and the common turn builds no keyword dict).
                    if choice == "auto":
                        turn: ModelTurn = await self.model.chat(
                            messages, self.tools, temperature=config.temperature, max_tokens=config.max_tokens
                        )
                    else:
                        turn = await self.model.chat(
                            messages,
                            self.tools,
                            temperature=config.temperature,
                            max_tokens=config.max_tokens,
                            tool_choice=choice,
                        )
            except TimeoutError:
                return _end(
                    done, "model_timeout", f"the model server did not answer within {config.model_timeout_s:.0f}s"
                )
            except ModelError as exc:
                if _is_context_overflow(str(exc)):
                    return _end(done, "context_full", str(exc))
                if isinstance(exc, ModelRequestError):
                    raise  # a 4xx: the request is wrong for every rollout; the env stops the command
                return _end(done, "model_error", str(exc))
            t1 = clock()
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
                tool_calls=[c["function"]["name"] for c in calls],
                finish_reason=turn.finish_reason,
                usage=turn.usage,
                calls_from_text=turn.calls_from_text,
                parse_errors=tuple(turn.parse_errors),
            )
            turns.append(record)
            if not calls:
                return _end(done, "finished")
            del turn  # not kept alive across the tool calls: one object fewer for the collector
            try:
                if t1 >= deadline:
                    raise TimeoutError  # the model answered after the deadline: no time for tools
                async with asyncio.timeout_at(deadline):
                    if len(calls) == 1:  # the common case needs no task of its own
                        fn = calls[0]["function"]
                        results = [
                            await self.registry.call(fn["name"], fn.get("arguments"), self.context, self._allowed)
                        ]
                    else:
                        results = await self._run_calls(calls)
            except ToolInfrastructureError as exc:
                record.tools_s = clock() - t1
                return _end(done, "infrastructure_error", str(exc))
            except TimeoutError:
                record.tools_s = clock() - t1
                for call in calls:
                    self._answer(messages, tool_errors, index, call, _OUT_OF_TIME)
                return _end(done, "time_budget")
            record.tools_s = clock() - t1
            for call, result in zip(calls, results):
                self._answer(messages, tool_errors, index, call, result)
        return _end(done, "max_turns")

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
