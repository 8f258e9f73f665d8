"""smolagents as upstream behaves, proven against the installed package: the same CodeAgent run (same
scripted model outputs, same `additional_args`) once with smolagents' own `LocalPythonExecutor` and once
with `SlotPythonExecutor` in a real sandbox slot shows the model the same observation and error text
at every step; stop strings are handled as an API given `stop` handles them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("smolagents")

from smolagents import CodeAgent, Tool  # noqa: E402
from smolagents.memory import ActionStep  # noqa: E402
from smolagents.models import ChatMessage, MessageRole, Model  # noqa: E402
from smolagents.monitoring import LogLevel  # noqa: E402

from environments.models.base import ModelTurn, TurnOptions  # noqa: E402
from environments.smolagents_gaia.executor import Bridge, SlotPythonExecutor  # noqa: E402
from environments.smolagents_gaia.model import CapturingModel  # noqa: E402
from tests.codeact.test_code_actions import make_env  # noqa: E402
from tests.support.scripted_openai import ScriptedOpenAIServer  # noqa: E402
from tools.context import ToolContext  # noqa: E402

pytestmark = pytest.mark.slow

# Multi-statement steps: print + trailing expression (a str, shown by str() not repr()), an assignment
# last, an augmented assignment last, if/for/while last, a tuple, exceptions raised by the code, a syntax
# error, state carried across steps, and the additional_args used as variables.
STEPS = [
    'total = sum(numbers)\nprint("sum is", total)\nlabel',
    "scaled = [n * 2 for n in numbers]\nprint(scaled, len(scaled))\ncount = len(scaled)",
    'print(f"{label}-{count}")\ncount += 4',
    'import math\nroot = math.sqrt(total + 4)\nif root > 3:\n    kind = "big"\nelse:\n    kind = "small"',
    'for n in numbers:\n    print("n", n)\n    n * 10',
    "i = 0\nwhile i < 2:\n    i += 1",
    'print("before the error")\nratio = total / 0\nprint("never")',
    'info = {"label": label, "count": count}\nprint(info)\nint("seven")',
    'raise ValueError(f"bad {label}")',
    "x = (1,\n",
    'print("state kept:", total, count, kind)\n(total, kind)',
    'note = "a"\nnote *= 3\nprint(note, sep="|", end="!")\nfinal_answer(f"{label}:{total}:{note}")',
]
ARGS = {"numbers": [3, 4, 5], "label": "north"}


class Scripted(Model):
    """Returns the next code action as an API given `stop` would (the text before `</code>`)."""

    def __init__(self, actions: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.actions = list(actions)

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None, **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content=f"Thought: go.\n<code>\n{self.actions.pop(0)}\n")


def seen(agent: CodeAgent) -> list[tuple[str | None, str | None, bool]]:
    steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
    return [(s.observations, None if s.error is None else str(s.error), s.is_final_answer) for s in steps]


def run_upstream() -> tuple[Any, list[tuple[str | None, str | None, bool]]]:
    agent = CodeAgent(
        tools=[],
        model=Scripted(STEPS),
        executor_type="local",
        additional_authorized_imports=["*"],
        max_steps=len(STEPS),
        verbosity_level=LogLevel.OFF,
    )
    answer = agent.run("Combine the numbers.", additional_args=dict(ARGS))
    return answer, seen(agent)


async def test_observations_match_smolagents_local_executor(tmp_path: Path) -> None:
    expected_answer, expected = await asyncio.to_thread(run_upstream)
    async with ScriptedOpenAIServer([]) as server, make_env(tmp_path, server.base_url).runtime() as env:
        backend = env.agent_runtime.tool_backend
        assert backend is not None
        async with backend.trajectory("parity") as slot:
            loop = asyncio.get_running_loop()
            executor = SlotPythonExecutor(
                ToolContext(executor=slot, task_id="parity"),
                Bridge(loop, loop.time() + 600),
                env.agent_runtime.registry,
                timeout_s=60,
                max_output_chars=50_000,
            )
            agent = CodeAgent(
                tools=[],
                model=Scripted(STEPS),
                executor=executor,
                additional_authorized_imports=["*"],
                max_steps=len(STEPS),
                verbosity_level=LogLevel.OFF,
            )
            answer = await asyncio.to_thread(agent.run, "Combine the numbers.", additional_args=dict(ARGS))
            got = seen(agent)
    # The differential itself, step by step, so a failure names the step.
    assert len(got) == len(expected) == len(STEPS)
    for code, mine, theirs in zip(STEPS, got, expected):
        assert mine == theirs, code
    assert answer == expected_answer == "north:12:aaa"
    # What the comparison covers (so the equality above is not vacuous).
    observations = [o or "" for o, _, _ in expected]
    assert "Last output from code snippet:\nnorth" in observations[0]  # str(), not repr()
    assert observations[1].endswith("Last output from code snippet:\n3")  # an assignment's value
    assert observations[2].endswith("Last output from code snippet:\n7")
    assert observations[3].endswith("\nbig")
    assert observations[4].endswith("\n50") and observations[5].endswith("\nNone")
    assert observations[6] == "Execution logs:\nbefore the error\n"
    assert "ZeroDivisionError: division by zero" in str(expected[6][1])
    assert "ValueError: bad north" in str(expected[8][1]) and "Code parsing failed" in str(expected[9][1])
    assert observations[10] == "Execution logs:\nstate kept: 12 7 big\nLast output from code snippet:\n(12, 'big')"


class FakeChat:
    """A chat model whose output runs past the stop string, as a server not given `stop` returns it."""

    async def chat(self, messages: Any, tools: Any, options: TurnOptions) -> ModelTurn:
        return ModelTurn(content="Thought: x.\n<code>\nprint(1)\nObservation: made up\n</code>")


async def test_stop_string_is_dropped_and_smolagents_closes_the_block() -> None:
    """Upstream: the API drops the stop string and CodeAgent appends `</code>`. The written text (the stop
    string included) stays in `raw` for the transcript and tokens."""
    loop = asyncio.get_running_loop()
    model = CapturingModel(
        FakeChat(),  # type: ignore[arg-type]
        Bridge(loop, loop.time() + 60),
        temperature=0.0,
        max_tokens=64,
        timeout_s=30,
    )
    message = await asyncio.to_thread(model.generate, [], stop_sequences=["Observation:", "</code>"])
    assert message.content == "Thought: x.\n<code>\nprint(1)\n"
    assert message.raw == {"text": "Thought: x.\n<code>\nprint(1)\nObservation:"}


class Helper(Tool):
    name = "helper"
    description = "A tool that runs in the agent's process."
    inputs = {"x": {"type": "string", "description": "anything"}}
    output_type = "string"

    def forward(self, x: str) -> str:
        return x


async def test_unsupported_tools_and_managed_agents_are_refused_in_one_line() -> None:
    loop = asyncio.get_running_loop()
    executor = SlotPythonExecutor(
        None,  # type: ignore[arg-type]
        Bridge(loop, loop.time() + 60),
        None,  # type: ignore[arg-type]
        timeout_s=1,
        max_output_chars=100,
    )
    with pytest.raises(ValueError, match=r"^tool 'helper' is not supported by SlotPythonExecutor") as tool:
        executor.send_tools({"helper": Helper()})
    sub = CodeAgent(tools=[], model=Scripted([]), name="researcher", description="d", verbosity_level=LogLevel.OFF)
    with pytest.raises(ValueError, match=r"^managed agents are not supported .*researcher") as agent:
        executor.send_tools({"researcher": sub})
    with pytest.raises(ValueError, match=r"additional_args 'lock' cannot be sent into the slot"):
        executor.send_variables({"lock": lambda: 1})
    assert "\n" not in str(tool.value) and "\n" not in str(agent.value)
