"""The code-action executor's state: the slot pickles the model's globals (`.codeact/values.pkl`) and writes its
outcome (`.codeact/result.json`); everything under `.codeact/` is the model's to rewrite. Nothing outside
the slot may ever load those bytes as anything but capped JSON: a pickle written there must never run on
the host, and a forged outcome must be the model's error, never the host's.

The attack runs smolagents' CodeAgent with `SlotPythonExecutor` in a real slot; its code actions register
an `atexit` hook, so their bytes land after the driver has written its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("smolagents")

from smolagents import CodeAgent  # noqa: E402
from smolagents.memory import ActionStep  # noqa: E402
from smolagents.models import ChatMessage, MessageRole, Model  # noqa: E402
from smolagents.monitoring import LogLevel  # noqa: E402

from environments.smolagents_gaia.executor import Bridge, SlotPythonExecutor  # noqa: E402
from tests.security.conftest import running_sandbox  # noqa: E402
from tests.support.docker_engine import SandboxPlace  # noqa: E402
from tools.context import ToolContext  # noqa: E402
from tools.registry import ToolRegistry  # noqa: E402

pytestmark = pytest.mark.slow


class Scripted(Model):
    def __init__(self, actions: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.actions = list(actions)

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None, **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content=f"Thought: x.\n<code>\n{self.actions.pop(0)}\n")


def plant(files: dict[str, str]) -> str:
    """A code action whose interpreter, on its way out (after the driver), rewrites `.codeact/` files."""
    return f"""
import atexit, pickle
class Payload:
    def __reduce__(self):
        return (open, (MARK, "w"))
BLOBS = {{"pickle": pickle.dumps(Payload()), "deep": b"[" * 60000 + b"]" * 60000}}
def rewrite():
    for name, kind in {files!r}.items():
        with open(".codeact/" + name, "wb") as f:
            f.write(BLOBS[kind])
atexit.register(rewrite)
print("planted")
"""


async def run_agent(where: SandboxPlace, actions: list[str]) -> tuple[Any, list[ActionStep]]:
    async with running_sandbox(where) as backend, backend.trajectory("codeact-state") as slot:
        loop = asyncio.get_running_loop()
        executor = SlotPythonExecutor(
            ToolContext(executor=slot, task_id="codeact-state"),
            Bridge(loop, loop.time() + 600),
            ToolRegistry(),
            timeout_s=60,
            max_output_chars=20_000,
        )
        agent = CodeAgent(
            tools=[],
            model=Scripted(actions),
            executor=executor,
            max_steps=len(actions),
            verbosity_level=LogLevel.OFF,
        )
        answer = await asyncio.to_thread(agent.run, "Do your worst.")
    return answer, [s for s in agent.memory.steps if isinstance(s, ActionStep)]


async def test_pickles_the_slot_writes_never_run_outside_it(sandbox_at: SandboxPlace) -> None:
    mark = sandbox_at.tmp_path / "unpickled_outside_the_slot"
    actions = [
        plant({"values.pkl": "pickle", "result.json": "pickle"}).replace("MARK", repr(str(mark))),
        'print("next step")',  # the slot's driver loads the planted state: in the slot, where MARK is no path
        'final_answer("done")',
    ]
    answer, steps = await run_agent(sandbox_at, actions)
    assert not mark.exists()
    assert answer == "done", [(s.observations, s.error) for s in steps]
    # The host read the planted outcome as bytes it cannot parse, and said so; the model's next step ran.
    assert "the code action's outcome file was overwritten" in str(steps[0].error)
    assert "next step" in str(steps[1].observations)


async def test_a_forged_outcome_is_the_models_error_not_the_hosts(sandbox_at: SandboxPlace) -> None:
    """A deeply nested JSON outcome (which exhausts the host's JSON parser's recursion) is refused as forged."""
    answer, steps = await run_agent(
        sandbox_at,
        [plant({"result.json": "deep"}).replace("MARK", "'unused'"), 'final_answer("after")'],
    )
    assert answer == "after"
    assert str(steps[0].error).endswith("the code action's outcome file was overwritten"), steps[0].error
