"""HermesAgentLoop against a scripted OpenAI-compatible HTTP server and real local tools."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from environments.agent_loop import AgentLoopConfig, HermesAgentLoop
from environments.models.base import ModelRequestError
from environments.models.chat_mode import OpenAIChatConfig, OpenAIChatModel
from model_tools import get_tool_definitions
from tests.support.scripted_openai import ScriptedOpenAIServer, tool_call
from tools.context import ToolContext
from tools.executor import LocalWorkspace, ToolInfrastructureError

USER = [{"role": "user", "content": "What is 6*7?"}]


def make_loop(base_url: str, tmp_path, toolsets=("python", "terminal"), **config) -> HermesAgentLoop:
    model = OpenAIChatModel(OpenAIChatConfig(base_url=base_url, model="scripted", max_retries=0))
    ctx = ToolContext(LocalWorkspace(tmp_path / "ws"))
    return HermesAgentLoop(model, get_tool_definitions(list(toolsets)), ctx, AgentLoopConfig(**config))


async def test_tool_call_then_answer(tmp_path):
    script = [
        {"content": None, "tool_calls": [tool_call("python", {"code": "print(6*7)"}, "c1")]},
        {"content": "The answer is \\boxed{42}.", "reasoning_content": "6*7=42 per the tool"},
    ]
    async with ScriptedOpenAIServer(script) as server:
        result = await make_loop(server.base_url, tmp_path).run(USER)
    assert result.stop_reason == "finished" and result.finished_naturally
    assert result.turns_used == 2
    roles = [m["role"] for m in result.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    tool_msg = result.messages[2]
    assert tool_msg["tool_call_id"] == "c1" and json.loads(tool_msg["content"])["output"] == "42\n"
    assert result.messages[-1]["reasoning_content"] == "6*7=42 per the tool"
    # the loop passed tools= and the tool result went back to the server
    assert {t["function"]["name"] for t in server.requests[0]["tools"]} == {"python", "terminal"}
    assert server.requests[1]["messages"][2]["role"] == "tool"
    assert all("reasoning_content" not in m for m in server.requests[1]["messages"])
    assert result.turns[0].tool_calls == ("python",) and result.turns[0].usage["total_tokens"] == 15


async def test_two_calls_in_one_turn_run_concurrently_and_keep_order(tmp_path):
    calls = [
        tool_call("terminal", {"command": "sleep 1; echo first"}, "a"),
        tool_call("terminal", {"command": "sleep 1; echo second"}, "b"),
    ]
    async with ScriptedOpenAIServer([{"content": None, "tool_calls": calls}, {"content": "done"}]) as server:
        result = await make_loop(server.base_url, tmp_path).run(USER)
    tool_msgs = [m for m in result.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["a", "b"]
    assert json.loads(tool_msgs[0]["content"])["output"] == "first\n"
    assert json.loads(tool_msgs[1]["content"])["output"] == "second\n"
    # run one after the other they would take >= 2 s
    assert result.turns[0].tools_s < 1.8


async def test_unknown_tool_and_invalid_json_go_back_as_tool_errors(tmp_path):
    calls = [tool_call("rm_rf", {"path": "/"}, "u"), tool_call("python", '{"code": "print(1)"', "j")]
    async with ScriptedOpenAIServer([{"content": None, "tool_calls": calls}, {"content": "ok"}]) as server:
        result = await make_loop(server.base_url, tmp_path).run(USER)
    tool_msgs = [json.loads(m["content"]) for m in result.messages if m["role"] == "tool"]
    assert "unknown tool 'rm_rf'" in tool_msgs[0]["error"]
    assert "not valid JSON" in tool_msgs[1]["error"]
    assert [e.tool for e in result.tool_errors] == ["rm_rf", "python"]
    assert result.stop_reason == "finished"


async def test_tool_outside_enabled_toolsets_is_unknown(tmp_path):
    calls = [tool_call("terminal", {"command": "echo hi"}, "t")]
    async with ScriptedOpenAIServer([{"content": None, "tool_calls": calls}, {"content": "ok"}]) as server:
        result = await make_loop(server.base_url, tmp_path, toolsets=("python",)).run(USER)
    assert "unknown tool 'terminal'" in json.loads(result.messages[2]["content"])["error"]


async def test_max_turns(tmp_path):
    script = [{"content": None, "tool_calls": [tool_call("python", {"code": "print(1)"})]} for _ in range(5)]
    async with ScriptedOpenAIServer(script) as server:
        result = await make_loop(server.base_url, tmp_path, max_turns=3).run(USER)
    assert result.stop_reason == "max_turns" and not result.finished_naturally
    assert result.turns_used == 3 and len(server.requests) == 3


async def test_time_budget_stops_a_slow_tool(tmp_path):
    calls = [tool_call("terminal", {"command": "sleep 20", "timeout": 60})]
    async with ScriptedOpenAIServer([{"content": None, "tool_calls": calls}, {"content": "never"}]) as server:
        t0 = time.monotonic()
        result = await make_loop(server.base_url, tmp_path, time_budget_s=1.5).run(USER)
        elapsed = time.monotonic() - t0
    assert result.stop_reason == "time_budget"
    assert elapsed < 10
    assert "time budget" in json.loads(result.messages[-1]["content"])["error"]
    assert len(server.requests) == 1


async def test_a_model_server_that_never_answers_is_infrastructure_not_a_score(tmp_path):
    async with ScriptedOpenAIServer([{"content": "late"}], delay_s=5) as server:
        result = await make_loop(server.base_url, tmp_path, time_budget_s=60, model_timeout_s=1.0).run(USER)
    assert result.stop_reason == "model_timeout" and result.turns_used == 0
    assert result.infrastructure_failure  # voided and retried by the env, never scored 0


async def test_a_slow_but_answering_server_is_scored_and_the_budget_stops_the_next_step(tmp_path):
    script = [{"content": None, "tool_calls": [tool_call("python", {"code": "print(1)"})]}, {"content": "never asked"}]
    async with ScriptedOpenAIServer(script, delay_s=2) as server:
        result = await make_loop(server.base_url, tmp_path, time_budget_s=1.0).run(USER)
    assert result.stop_reason == "time_budget" and result.turns_used == 1 and not result.infrastructure_failure
    assert len(server.requests) == 1


async def test_a_4xx_is_a_request_error_raised_once_not_retried(tmp_path):
    async with ScriptedOpenAIServer([400, {"content": "never reached"}]) as server:
        with pytest.raises(ModelRequestError, match="HTTP 400"):
            await make_loop(server.base_url, tmp_path).run(USER)
    assert len(server.requests) == 1


async def test_server_5xx_is_a_model_error_not_a_crash(tmp_path):
    async with ScriptedOpenAIServer([503]) as server:
        result = await make_loop(server.base_url, tmp_path).run(USER)
    assert result.stop_reason == "model_error" and result.infrastructure_failure
    assert "HTTP 503" in result.error and server.base_url in result.error


async def test_unreachable_server_names_the_url(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    result = await make_loop(url, tmp_path).run(USER)
    assert result.stop_reason == "model_error"
    assert url in result.error and "cannot reach" in result.error


async def test_tool_calls_written_as_text_are_recovered(tmp_path):
    text = 'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(2**10)"}}\n</tool_call>'
    async with ScriptedOpenAIServer([{"content": text}, {"content": "\\boxed{1024}"}]) as server:
        result = await make_loop(server.base_url, tmp_path).run(USER)
    assistant = result.messages[1]
    assert assistant["content"].strip() == "Let me compute."
    assert assistant["tool_calls"][0]["function"]["name"] == "python"
    assert json.loads(result.messages[2]["content"])["output"] == "1024\n"
    assert result.turns[0].calls_from_text


async def test_answer_without_tools_finishes_in_one_turn(tmp_path):
    async with ScriptedOpenAIServer([{"content": "42"}]) as server:
        result = await make_loop(server.base_url, tmp_path, max_turns=1).run(USER)
    assert result.stop_reason == "finished" and result.final_response == "42"


class _DyingWorkspace(LocalWorkspace):
    """A workspace whose sandbox dies: every command raises an infrastructure error."""

    async def exec(self, command, **kwargs):
        raise ToolInfrastructureError("sandbox sb-1 stopped answering")


async def test_a_dying_sandbox_voids_the_trajectory_instead_of_telling_the_model(tmp_path):
    calls = [tool_call("terminal", {"command": "echo hi"}, "t")]
    async with ScriptedOpenAIServer([{"content": None, "tool_calls": calls}, {"content": "never"}]) as server:
        model = OpenAIChatModel(OpenAIChatConfig(base_url=server.base_url, model="scripted", max_retries=0))
        ctx = ToolContext(_DyingWorkspace(tmp_path / "ws"))
        result = await HermesAgentLoop(model, get_tool_definitions(["terminal"]), ctx).run(USER)
    assert result.stop_reason == "infrastructure_error" and result.infrastructure_failure
    assert "sb-1 stopped answering" in result.error
    assert not any(m["role"] == "tool" for m in result.messages), "the model never sees the breakage"


# --- time budget and cancellation: one timeout scope per trajectory must stay exact ---------


async def test_model_timeout_is_never_cut_short_and_leaves_no_pending_cancel(tmp_path):
    async with ScriptedOpenAIServer([{"content": "late"}], delay_s=5) as server:
        t0 = time.monotonic()
        result = await make_loop(server.base_url, tmp_path, model_timeout_s=0.8).run(USER)
        elapsed = time.monotonic() - t0
        # The timeout's cancellation belongs to the loop: the caller's task carries on undisturbed.
        assert asyncio.current_task().cancelling() == 0
        await asyncio.sleep(0.01)
    assert result.stop_reason == "model_timeout"
    assert 0.8 <= result.duration_s <= elapsed < 4.5  # not early; the 5 s reply was not waited for


async def test_tool_budget_is_never_cut_short(tmp_path):
    calls = [tool_call("terminal", {"command": "sleep 20", "timeout": 60}, "s")]
    async with ScriptedOpenAIServer([{"content": None, "tool_calls": calls}, {"content": "never"}]) as server:
        result = await make_loop(server.base_url, tmp_path, time_budget_s=1.0).run(USER)
        assert asyncio.current_task().cancelling() == 0
    assert result.stop_reason == "time_budget" and 1.0 <= result.duration_s < 8


async def test_time_budget_answers_every_parallel_call_that_ran_out(tmp_path):
    calls = [
        tool_call("terminal", {"command": "echo quick"}, "q"),
        tool_call("terminal", {"command": "sleep 20", "timeout": 60}, "s"),
    ]
    async with ScriptedOpenAIServer([{"content": None, "tool_calls": calls}, {"content": "never"}]) as server:
        result = await make_loop(server.base_url, tmp_path, time_budget_s=1.5).run(USER)
    assert result.stop_reason == "time_budget" and len(server.requests) == 1
    tool_msgs = [m for m in result.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["q", "s"]
    assert all("time budget" in json.loads(m["content"])["error"] for m in tool_msgs)
    assert [e.tool for e in result.tool_errors] == ["terminal", "terminal"]
    assert result.turns[0].tools_s >= 1.5 - result.turns[0].model_s - 0.05


async def _cancelled_mid_tool(tmp_path, server, calls) -> None:
    # Local tools run in their own pid namespace, so `$$` is no host pid: the test finds the
    # commands by their (unique) sleep arguments instead.
    pid_file = tmp_path / "ws" / "pid"
    task = asyncio.create_task(make_loop(server.base_url, tmp_path, time_budget_s=60).run(USER))
    for _ in range(400):  # the tool has started once its shell wrote its pid
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("cancelling the rollout must cancel it, not turn into a result")


async def test_cancelling_a_rollout_during_a_lone_tool_call_kills_the_command(tmp_path):
    calls = [tool_call("terminal", {"command": "echo $$ > pid; exec sleep 30.71", "timeout": 60}, "a")]
    async with ScriptedOpenAIServer([{"content": None, "tool_calls": calls}, {"content": "never"}]) as server:
        await _cancelled_mid_tool(tmp_path, server, calls)
    assert not _sleepers("30.71"), "the cancelled tool's process outlived the rollout"


async def test_cancelling_a_rollout_during_parallel_tool_calls_kills_every_command(tmp_path):
    calls = [
        tool_call("terminal", {"command": "echo $$ > pid; exec sleep 30.72", "timeout": 60}, "a"),
        tool_call("terminal", {"command": "exec sleep 31.72", "timeout": 60}, "b"),
    ]
    async with ScriptedOpenAIServer([{"content": None, "tool_calls": calls}, {"content": "never"}]) as server:
        await _cancelled_mid_tool(tmp_path, server, calls)
    assert not _sleepers("30.72"), "the first call's command outlived the rollout"
    assert not _sleepers("31.72"), "the second call's command outlived the rollout"


async def test_cancelling_a_rollout_during_the_model_call_propagates(tmp_path):
    async with ScriptedOpenAIServer([{"content": "late"}], delay_s=5) as server:
        task = asyncio.create_task(make_loop(server.base_url, tmp_path, time_budget_s=0.5).run(USER))
        await asyncio.sleep(0.2)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("an outside cancel must not be reported as the time budget")


def _sleepers(arg: str) -> list[str]:
    """Processes running `sleep ARG` a moment later (a killed child may take a beat to go)."""
    for _ in range(50):
        out = []
        for proc in Path("/proc").iterdir():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd[:2] == [b"sleep", arg.encode()]:
                out.append(proc.name)
        if not out:
            return out
        time.sleep(0.1)
    return out
