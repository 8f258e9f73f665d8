"""The agent loop's one timer per trajectory (environments/watchdog.py): its limits are exact across
turns, whichever limit its pending timer was set for, and its cancellation never leaks to the caller."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from environments.agent_loop import AgentLoopConfig, HermesAgentLoop
from environments.models.base import ModelTurn
from environments.watchdog import Watchdog
from tools.context import ToolContext
from tools.registry import Tool, ToolRegistry

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


class TwoTurnModel:
    """A tool call on the first turn; the second turn runs `second` (a coroutine function), then answers."""

    def __init__(self, second: Any) -> None:
        self.second = second

    async def chat(self, messages, tools, options):
        if not any(m["role"] == "tool" for m in messages):
            call = {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": '{"text": "hi"}'}}
            return ModelTurn(content=None, tool_calls=[call], finish_reason="tool_calls")
        await self.second()
        return ModelTurn(content="done", finish_reason="stop")


def make_loop(model: Any, handler: Any, **config: Any) -> HermesAgentLoop:
    registry = ToolRegistry([Tool("echo", "test", "Echo.", SCHEMA, handler)])
    ctx = ToolContext(executor=None, task_id="t")  # type: ignore[arg-type]  # echo needs no executor
    return HermesAgentLoop(model, registry.definitions(), ctx, AgentLoopConfig(**config), registry)


async def echo(args: dict[str, Any], context: Any) -> str:
    return args["text"]


async def test_the_budget_passing_during_a_later_model_call_does_not_cut_that_call_short():
    # The tool step set the timer for the budget; the model step after it is bounded by its own
    # (later) timeout only, so the timer firing at the budget must move on, not cancel.
    async def slow() -> None:
        await asyncio.sleep(0.6)

    result = await make_loop(TwoTurnModel(slow), echo, time_budget_s=0.2, model_timeout_s=30).run([])
    assert result.stop_reason == "finished" and result.turns_used == 2
    assert result.messages[-1]["content"] == "done"
    assert asyncio.current_task().cancelling() == 0


async def test_a_model_timeout_after_a_tool_turn_is_exact_and_leaves_no_pending_cancel():
    never = asyncio.Event()
    result = await make_loop(TwoTurnModel(never.wait), echo, time_budget_s=60, model_timeout_s=0.3).run([])
    assert result.stop_reason == "model_timeout" and result.turns_used == 1
    assert result.duration_s >= 0.3 + result.turns[0].model_s
    assert "did not answer within" in result.error
    assert asyncio.current_task().cancelling() == 0
    await asyncio.sleep(0)  # a cancel left pending would land here


async def test_a_tool_that_swallows_the_budget_cancel_keeps_its_answer_and_the_budget_ends_the_rollout():
    # As with asyncio.timeout: a step that finishes despite the cancel keeps its result.
    async def stubborn(args: dict[str, Any], context: Any) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "finished anyway"
        return "unreachable"

    result = await make_loop(TwoTurnModel(asyncio.sleep), stubborn, time_budget_s=0.2).run([])
    assert result.stop_reason == "time_budget" and result.turns_used == 1
    assert result.messages[-1] == {"role": "tool", "tool_call_id": "c1", "name": "echo", "content": "finished anyway"}
    assert asyncio.current_task().cancelling() == 0


async def test_the_budget_answers_a_cut_tool_call_with_an_error():
    never = asyncio.Event()

    async def hangs(args: dict[str, Any], context: Any) -> str:
        await never.wait()
        return "unreachable"

    result = await make_loop(TwoTurnModel(asyncio.sleep), hangs, time_budget_s=0.2).run([])
    assert result.stop_reason == "time_budget" and result.turns_used == 1
    assert "time budget" in json.loads(result.messages[-1]["content"])["error"]
    assert [e.tool for e in result.tool_errors] == ["echo"]
    assert result.turns[0].tools_s >= 0.2 - result.turns[0].model_s
    assert asyncio.current_task().cancelling() == 0


async def test_a_cancel_from_outside_propagates_and_is_not_a_timeout():
    started = asyncio.Event()

    async def hangs(args: dict[str, Any], context: Any) -> str:
        started.set()
        await asyncio.Event().wait()
        return "unreachable"

    task = asyncio.create_task(make_loop(TwoTurnModel(asyncio.sleep), hangs, time_budget_s=60).run([]))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_later_due_moves_the_timer_instead_of_firing_early():
    loop = asyncio.get_running_loop()
    watchdog = Watchdog()
    watchdog.arm(loop.time() + 0.05)
    due = loop.time() + 0.3
    watchdog.arm(due)  # the pending timer fires first and must set itself again for `due`
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        assert watchdog.expired()
    assert loop.time() >= due
    assert asyncio.current_task().cancelling() == 0
    watchdog.close()


async def test_closing_stops_the_timer():
    loop = asyncio.get_running_loop()
    watchdog = Watchdog()
    watchdog.arm(loop.time() + 0.01)
    watchdog.close()
    await asyncio.sleep(0.1)  # timers fire in order of their time: the closed one would have come first
    assert asyncio.current_task().cancelling() == 0
    assert not watchdog.expired()


async def test_a_watchdog_needs_a_task():
    loop = asyncio.get_running_loop()
    said: asyncio.Future[str] = loop.create_future()

    def outside_any_task() -> None:  # a callback runs in the loop but in no task
        try:
            Watchdog()
        except RuntimeError as exc:
            said.set_result(str(exc))

    loop.call_soon(outside_any_task)
    assert "inside one" in await said
