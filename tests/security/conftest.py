"""Attack tests: a scripted model plays the hostile agent through the real agent loop.

Every attack goes through the tool calls an agent can make (terminal, python, read_file,
write_file, search_files), against real sandbox_server processes under real bubblewrap,
or against the local workspace backend.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends import LocalBackendConfig, make_backend
from environments.agent_loop import AgentLoopConfig, HermesAgentLoop
from environments.models.chat_mode import OpenAIChatConfig, OpenAIChatModel
from model_tools import get_tool_definitions
from slots.pool import SlotPool, SlotPoolConfig
from tests.support.scripted_openai import ScriptedOpenAIServer, tool_call
from tools.context import ToolContext, ToolLimits

TOOLSETS = ("terminal", "python", "file")


async def play(
    executor,
    turns: list[list[tuple[str, dict[str, Any]]]],
    *,
    time_budget_s: float = 120.0,
    limits: ToolLimits | None = None,
) -> list[dict[str, Any]]:
    """Run the agent loop with a model that makes `turns` (each a list of tool calls), then stops.

    Returns the tool messages in order, each with its parsed JSON content under "result".
    """
    script: list[Any] = [{"content": None, "tool_calls": [tool_call(n, a) for n, a in calls]} for calls in turns]
    script.append({"content": "done"})
    async with ScriptedOpenAIServer(script) as server:
        model = OpenAIChatModel(OpenAIChatConfig(base_url=server.base_url, model="scripted", max_retries=0))
        ctx = ToolContext(executor, limits=limits or ToolLimits())
        loop = HermesAgentLoop(
            model,
            get_tool_definitions(list(TOOLSETS)),
            ctx,
            AgentLoopConfig(max_turns=len(turns) + 1, time_budget_s=time_budget_s),
        )
        result = await loop.run([{"role": "user", "content": "do your worst"}])
    tool_msgs = [m for m in result.messages if m["role"] == "tool"]
    for m in tool_msgs:
        try:
            m["result"] = json.loads(m["content"])
        except json.JSONDecodeError:
            m["result"] = {"raw": m["content"]}
    play.last_result = result  # type: ignore[attr-defined]  # tests read the last result off the function
    return tool_msgs


def sandbox_backend(tmp_path, *, slots: int = 2, sandboxes: int = 1, limits: dict | None = None, **pool) -> SlotPool:
    config = SlotPoolConfig(
        slots_per_sandbox=slots, min_sandboxes=sandboxes, max_sandboxes=sandboxes, health_interval_s=30, **pool
    )
    local = LocalBackendConfig(pool=config, data_root=str(tmp_path / "sb"), **({"limits": limits} if limits else {}))
    return make_backend(local)


def server_data_dir(backend: SlotPool) -> Path:
    (proc,) = backend.provider._procs.values()
    return proc.data_dir


@contextlib.asynccontextmanager
async def running_sandbox(tmp_path, **kwargs: Any) -> AsyncIterator[SlotPool]:
    """`sandbox_backend(tmp_path, **kwargs)`, started, and stopped on the way out."""
    backend = sandbox_backend(tmp_path, **kwargs)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


@pytest.fixture
async def sandbox(tmp_path):
    async with running_sandbox(tmp_path) as backend:
        yield backend


def server_token(backend: SlotPool) -> str:
    (sb,) = backend._sandboxes.values()
    return sb.address.token


def all_text(msgs: list[dict[str, Any]]) -> str:
    return "\n".join(m["content"] for m in msgs)


@contextlib.contextmanager
def outer_process_limit(max_pids: int):
    """Put this test process (and so every process it starts) in a cgroup v1 pids group of `max_pids`.

    A fork bomb that got past the sandbox's own limits then fills this group, not the machine.
    """
    base = Path("/sys/fs/cgroup/pids")
    if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
        pytest.skip("needs a writable cgroup v1 pids hierarchy to contain the fork bomb safely")
    group = base / f"hermes-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    group.mkdir()
    try:
        (group / "pids.max").write_text(str(max_pids))
        (group / "cgroup.procs").write_text(str(os.getpid()))
        yield group
    finally:
        (base / "cgroup.procs").write_text(str(os.getpid()))
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@contextlib.contextmanager
def outer_memory_limit(max_bytes: int):
    """Cap the address space of processes started inside (a regression cannot eat the machine's memory)."""
    old = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(
        resource.RLIMIT_AS, (max_bytes, old[1])
    )  # soft only: raising a hard limit back needs a capability
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)
