"""A task's network and environment reach the agent's shell (issue 25, with issue 22's "no network
unless a task asks for it").

Harbor's task.toml schema: `[environment] allow_internet` defaults to true, and the agent and
test.sh run with network unless it is false. On the local backend a call given network shares the
host's network namespace (sandbox_server: bwrap without --unshare-net), so a listener on this
machine's 127.0.0.1 is exactly what such a call can reach and a call without network cannot.
`[environment.env]` (Harbor 1.1) and Endless `%environment` are the image's environment: the agent's
shell has them too, except PATH and HOME, which stay the sandbox's.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import textwrap
from pathlib import Path

import pytest

from environments.models.base import ModelTurn
from tests.terminal_tasks.conftest import make_env

FIXTURES = Path(__file__).parent / "fixtures"

# Terminal-Bench 2 / Harbor 1.1 task.toml shape; {internet} is an `allow_internet = ...` line or nothing.
TASK_TOML = """\
version = "1.0"

[metadata]
author_name = "hermes-rl"
difficulty = "easy"
category = "networking"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 120.0
cpus = 1
memory_mb = 512
{internet}

[environment.env]
GREETING = "hello from the image"
"""


def write_task(root: Path, port: int, internet: str) -> Path:
    """test.sh says hello to the listener: reward 1 if it got through."""
    files = {
        "task.toml": TASK_TOML.format(internet=internet),
        "instruction.md": "Say hello to the service on 127.0.0.1.\n",
        "environment/Dockerfile": "FROM ubuntu:22.04\nWORKDIR /app\n",
        "solution/solve.sh": "#!/bin/bash\ntrue\n",
        "tests/test.sh": textwrap.dedent(
            f"""\
            #!/bin/bash
            mkdir -p /logs/verifier
            if (exec 3<>/dev/tcp/127.0.0.1/{port}; echo verifier >&3); then
              echo 1 > /logs/verifier/reward.txt
            else
              echo 0 > /logs/verifier/reward.txt
            fi
            """
        ),
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


class Listener:
    """A TCP listener on this machine's loopback that records who said hello."""

    def __init__(self) -> None:
        self.hellos: list[str] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Listener:
        self.server = await asyncio.start_server(self._hello, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def _hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        self.hellos.append(line.decode().strip())
        writer.close()


class OneCommandAgent:
    """Runs one terminal command, then stops."""

    def __init__(self, command: str) -> None:
        self.command = command

    async def chat(self, messages, tools, options) -> ModelTurn:
        if any(m["role"] == "tool" for m in messages):
            return ModelTurn(content="done", tool_calls=[], finish_reason="stop")
        args = json.dumps({"command": self.command, "timeout": 30})
        call = {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": args}}
        return ModelTurn(content=None, tool_calls=[call], finish_reason="tool_calls")


def tool_output(rollout) -> str:
    assert rollout.error is None, rollout.error
    return json.loads(next(m for m in rollout.result.messages if m["role"] == "tool")["content"])["output"]


def agent_command(port: int) -> str:
    return (
        f"if (exec 3<>/dev/tcp/127.0.0.1/{port}; echo agent >&3) 2>/dev/null; "
        'then echo reached; else echo unreachable; fi; echo "GREETING=$GREETING"'
    )


@pytest.mark.parametrize(
    ("internet", "policy", "reached"),
    [
        ("allow_internet = true", "auto", False),  # the default: on the local backend network is the host's
        ("", "allow", True),  # Harbor's default: allow_internet = true
        ("allow_internet = true", "allow", True),
        ("allow_internet = false", "allow", False),
        ("allow_internet = true", "forbid", False),  # --env.task_network forbid: no task gets network
    ],
)
async def test_a_tasks_allow_internet_reaches_the_agent_and_the_verifier(
    scripted_server, tmp_path, internet, policy, reached
):
    async with Listener() as listener:
        write_task(tmp_path / "tasks" / "say-hello", listener.port, internet)
        env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"), task_network=policy)
        async with env.runtime():
            await env.setup()
            (task,) = env.tasks
            rollout = await env.rollout(task, model=OneCommandAgent(agent_command(listener.port)))
    output = tool_output(rollout)
    # the task's [environment.env] is in the agent's shell whatever its network
    assert "GREETING=hello from the image" in output
    if reached:
        assert "reached" in output.split() and rollout.score == 1.0
        assert sorted(listener.hellos) == ["agent", "verifier"]
    else:
        assert "unreachable" in output.split() and rollout.score == 0.0
        assert listener.hellos == []


def test_bundled_tasks_do_not_ask_for_network():
    from environments.terminal_tasks import BUNDLED_TASKS, load_tasks_dir

    assert [t.id for t in load_tasks_dir(BUNDLED_TASKS) if t.allow_internet] == []


async def test_endless_environment_reaches_the_agents_shell_but_not_path(scripted_server, tmp_path):
    tasks = tmp_path / "tasks"
    shutil.copytree(FIXTURES / "endless" / "task_000004_e5a7c9d1", tasks / "task_000004_e5a7c9d1")
    definition = tasks / "task_000004_e5a7c9d1" / "container.def"
    definition.write_text(
        definition.read_text().replace("%environment\n", "%environment\n    export PATH=/nowhere:$PATH\n")
    )
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tasks))
    async with env.runtime():
        await env.setup()
        (task,) = env.tasks
        rollout = await env.rollout(task, model=OneCommandAgent('echo "REPORT_DIR=$REPORT_DIR PATH=$PATH"'))
    output = tool_output(rollout)
    assert "REPORT_DIR=/home/user/reports" in output
    assert "/nowhere" not in output


async def test_a_caller_cannot_widen_the_trajectorys_network(scripted_server, tmp_path):
    async with Listener() as listener:
        write_task(tmp_path / "tasks" / "say-hello", listener.port, "allow_internet = false")
        env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"))
        async with env.runtime():
            await env.setup()
            (task,) = env.tasks
            async with env.open_workspace(task, "widen") as executor:
                with pytest.raises(PermissionError, match="no network"):
                    await executor.exec(agent_command(listener.port), timeout=10, max_output_bytes=1000, network=True)
                # the policy, when the caller names none
                result = await executor.exec(agent_command(listener.port), timeout=10, max_output_bytes=1000)
    assert "unreachable" in result.output.split() and listener.hellos == []


class OnePythonAgent:
    """Runs one python snippet, then stops."""

    def __init__(self, code: str) -> None:
        self.code = code

    async def chat(self, messages, tools, options) -> ModelTurn:
        if any(m["role"] == "tool" for m in messages):
            return ModelTurn(content="done", tool_calls=[], finish_reason="stop")
        args = json.dumps({"code": self.code})
        call = {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": args}}
        return ModelTurn(content=None, tool_calls=[call], finish_reason="tool_calls")


async def test_the_python_tool_gets_the_same_network_and_environment(scripted_server, tmp_path):
    code = textwrap.dedent(
        """\
        import os, socket
        with socket.create_connection(("127.0.0.1", {port}), timeout=5) as s:
            s.sendall(b"python\\n")
        print("GREETING=" + os.environ.get("GREETING", ""))
        """
    )
    async with Listener() as listener:
        write_task(tmp_path / "tasks" / "say-hello", listener.port, "allow_internet = true")
        env = make_env(
            scripted_server.base_url,
            tmp_path,
            tasks_dir=str(tmp_path / "tasks"),
            enabled_toolsets=["terminal", "file", "python"],
            task_network="allow",
        )
        async with env.runtime():
            await env.setup()
            (task,) = env.tasks
            rollout = await env.rollout(task, model=OnePythonAgent(code.format(port=listener.port)))
    assert "GREETING=hello from the image" in tool_output(rollout)
    assert sorted(listener.hellos) == ["python", "verifier"]
