"""A smolagents `PythonExecutor` that runs every code action in the trajectory's slot.

CodeAgent runs in a worker thread and calls this executor synchronously; each call is
bridged onto the event loop, where the trajectory's `ToolExecutor` runs the slot's Python
with `driver.py` on stdin. Nothing the model writes is evaluated in our process: we read back
only the printed output and a small JSON outcome.

Host-side tools (web search and extract) are a narrow call-out: inside the slot a stub
records the request and stops the action; here the request is answered through the
project's tool registry (the offline engine or Tavily, whose key stays in our process), and
the action is run again from the state saved before it, with the answers so far in its
payload. A call-out therefore re-runs the action's earlier statements: their printed output
is what the last run printed, and side effects on files may repeat (documented in
docs/code_actions.md).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import pickle
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from smolagents.local_python_executor import CodeOutput, PythonExecutor
from smolagents.tools import Tool

from tools.context import ToolContext
from tools.executor import ToolInfrastructureError
from tools.registry import ToolRegistry, cap_text

__all__ = ["SlotPythonExecutor", "HostTool", "WebSearchTool", "WebExtractTool", "CodeActionError", "Bridge"]

DRIVER_SOURCE = (Path(__file__).parent / "driver.py").read_text()
RESULT_PATH = ".codeact/result.json"

T = TypeVar("T")


class CodeActionError(Exception):
    """The model's code failed in the slot; smolagents shows the message to the model as the observation."""


class OutOfTime(Exception):
    """The trajectory's time budget ran out before a model call or a code action."""


@dataclass
class Bridge:
    """Runs coroutines on the trajectory's event loop from CodeAgent's worker thread."""

    loop: asyncio.AbstractEventLoop
    deadline: float  # the loop's clock
    stop: threading.Event = field(default_factory=threading.Event)
    infrastructure_error: BaseException | None = None
    out_of_time: bool = False
    pending: set[concurrent.futures.Future[Any]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        """Stop the agent's thread: later calls fail at once, a call in flight is cancelled (never left
        waiting on a loop that may stop, which would hang the pool's shutdown)."""
        self.stop.set()
        with self.lock:
            for future in self.pending:
                future.cancel()

    def run(self, make: Callable[[], Awaitable[T]], timeout: float) -> T:
        if self.stop.is_set():
            raise OutOfTime("the trajectory was stopped")
        left = self.deadline - self.loop.time()
        if left <= 0:
            self.out_of_time = True
            self.stop.set()
            raise OutOfTime("the trajectory's time budget ran out")

        async def bounded() -> T:
            async with asyncio.timeout(timeout):
                return await make()

        future = asyncio.run_coroutine_threadsafe(bounded(), self.loop)
        with self.lock:
            self.pending.add(future)
        if self.stop.is_set():  # closed between the check above and now
            future.cancel()
        try:
            return future.result()
        finally:
            with self.lock:
                self.pending.discard(future)


class HostTool(Tool):
    """A tool whose work happens on the host, reached from the slot through the call-out."""

    registry_name: str = ""
    skip_forward_signature_validation = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.name} runs on the host through SlotPythonExecutor's call-out, not in this process")

    def registry_arguments(self, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The registry tool's JSON arguments for a call from the slot (positional ones by input order)."""
        names = list(self.inputs)
        if len(args) > len(names):
            raise ValueError(f"{self.name} takes at most {len(names)} arguments, got {len(args)}")
        merged = dict(zip(names, args))
        for key, value in kwargs.items():
            if key in merged:
                raise ValueError(f"{self.name} got two values for {key!r}")
            merged[key] = value
        return merged


class WebSearchTool(HostTool):
    name = "web_search"
    registry_name = "web_search"
    description = "Search the web. Returns a JSON string with results (title, url, snippet)."
    inputs = {
        "query": {"type": "string", "description": "What to search for."},
        "max_results": {"type": "integer", "description": "How many results (1-10).", "nullable": True},
    }
    output_type = "string"


class WebExtractTool(HostTool):
    name = "web_extract"
    registry_name = "web_extract"
    description = "Read web pages. Returns a JSON string with each page's title and text."
    inputs = {"urls": {"type": "array", "description": "The URLs to read (a list of strings)."}}
    output_type = "string"


class SlotPythonExecutor(PythonExecutor):
    """Each code action runs in the slot; state is carried in the slot's workspace between actions."""

    def __init__(
        self,
        ctx: ToolContext,
        bridge: Bridge,
        registry: ToolRegistry,
        *,
        timeout_s: float,
        max_output_chars: int,
        max_callouts: int = 8,
    ) -> None:
        self.ctx = ctx
        self.bridge = bridge
        self.registry = registry
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.max_callouts = max_callouts
        self.host_tools: dict[str, HostTool] = {}
        self.final_answer: Any = None
        self.has_final_answer = False
        self.actions = 0
        self.callouts: list[dict[str, Any]] = []
        self.variables: dict[str, str] = {}  # additional_args not yet loaded in the slot: name -> base64 pickle
        # smolagents reads `state["_print_outputs"]` when an action fails, to show what it printed first.
        self.state: dict[str, Any] = {"_print_outputs": ""}

    # ---- smolagents' interface ---------------------------------------------------------------

    def send_tools(self, tools: dict[str, Any]) -> None:
        agents = sorted(name for name, tool in tools.items() if not isinstance(tool, Tool))
        if agents:  # smolagents' remote executors refuse them too: a sub-agent would run its own code here
            raise ValueError(
                f"managed agents are not supported by SlotPythonExecutor ({', '.join(agents)}): their code would "
                "run outside the slot; give their work to the main agent"
            )
        for name, tool in tools.items():
            if name == "final_answer":
                continue  # defined in the slot by the driver: it ends the action
            if not isinstance(tool, HostTool):
                raise ValueError(
                    f"tool {name!r} is not supported by SlotPythonExecutor: only HostTool call-outs run outside the "
                    "slot (the slot has its own Python for files and computation); wrap the tool's work in a HostTool"
                )
            self.host_tools[name] = tool

    def send_variables(self, variables: dict[str, Any]) -> None:
        """`agent.run(additional_args=...)`: pickled here, loaded in the slot before the next action (never the
        other way round: nothing the slot writes is unpickled in this process)."""
        for name, value in variables.items():
            if not name.isidentifier():
                raise ValueError(f"additional_args name {name!r} is not a Python identifier; rename it")
            try:
                blob = pickle.dumps(value)
            except Exception as exc:
                raise ValueError(
                    f"additional_args {name!r} cannot be sent into the slot ({type(exc).__name__}: {exc}); "
                    "pass a value that pickles"
                ) from exc
            self.variables[name] = base64.b64encode(blob).decode()

    def __call__(self, code_action: str) -> CodeOutput:
        self.actions += 1
        answers: list[dict[str, Any]] = []
        for _ in range(self.max_callouts + 1):
            logs, outcome = self._run_in_slot(code_action, answers)
            if outcome["status"] != "callout":
                self.variables = {}  # loaded and saved with the slot's state
                return self._output(logs, outcome)
            answers.append({"request": outcome["request"], "answer": self._answer(outcome["request"])})
        raise CodeActionError(
            f"the code called host tools more than {self.max_callouts} times in one action; split the work over steps"
        )

    # ---- internals -----------------------------------------------------------------------------

    def _run_in_slot(self, code: str, answers: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        payload = {
            "code": code,
            "answers": answers,
            "host_tools": sorted(self.host_tools),
            "variables": self.variables,
        }
        encoded = base64.b64encode(json.dumps(payload).encode()).decode()
        program = f"{DRIVER_SOURCE}\n_codeact_run({encoded!r})\n"
        executor = self.ctx.executor

        async def run() -> tuple[str, bytes | None]:
            result = await executor.exec(
                executor.python, timeout=self.timeout_s, max_output_bytes=self.max_output_chars, stdin=program
            )
            if result.timed_out:
                return f"{result.output}\n[the code ran longer than {self.timeout_s:.0f}s and was stopped]", None
            try:
                raw = await executor.read_file(RESULT_PATH)
            except ToolInfrastructureError:
                raise
            except Exception:  # the code removed it or ended the interpreter (os._exit) before the driver wrote it
                raw = None
            return result.output, raw

        try:
            logs, raw = self.bridge.run(run, self.timeout_s + 30.0)
        except ToolInfrastructureError as exc:
            self.bridge.infrastructure_error = exc
            self.bridge.stop.set()
            raise CodeActionError(f"the sandbox failed: {exc}") from exc
        if raw is None:
            return logs, {"status": "error", "error": "the interpreter ended before the code action finished"}
        try:  # the model's code can rewrite the outcome: capped, JSON only, any shape refused
            outcome = json.loads(raw[:200_000])
            if not isinstance(outcome, dict) or outcome.get("status") not in ("ok", "final", "error", "callout"):
                raise ValueError("not an outcome")
        except (ValueError, RecursionError):
            outcome = {"status": "error", "error": "the code action's outcome file was overwritten"}
        return logs, outcome

    def _answer(self, request: Any) -> str:
        """Serve one call-out on the host: the registry's tool, its answer as the model will see it."""
        if not isinstance(request, dict) or request.get("tool") not in self.host_tools:
            return json.dumps({"error": "unknown tool"})
        tool = self.host_tools[request["tool"]]
        args, kwargs = request.get("args"), request.get("kwargs")
        try:
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise ValueError("arguments must be JSON values")
            arguments = tool.registry_arguments(args, kwargs)
        except ValueError as exc:
            return json.dumps({"error": str(exc)})
        arguments = {k: v for k, v in arguments.items() if v is not None}
        self.callouts.append({"tool": tool.name, "arguments": arguments})
        registry, ctx = self.registry, self.ctx
        answer = self.bridge.run(
            lambda: registry.call(tool.registry_name, arguments, ctx, [tool.registry_name]), self.timeout_s + 30.0
        )
        return cap_text(answer, self.max_output_chars)

    def _output(self, logs: str, outcome: dict[str, Any]) -> CodeOutput:
        status = outcome["status"]
        if outcome.get("dropped"):
            logs += f"\n[note: not kept for the next step (cannot be pickled): {', '.join(outcome['dropped'])}]"
        self.state["_print_outputs"] = logs
        if status == "error":
            raise CodeActionError(str(outcome.get("error", "")))
        if status == "final":
            self.final_answer = outcome.get("output")
            self.has_final_answer = True
            return CodeOutput(output=self.final_answer, logs=logs, is_final_answer=True)
        return CodeOutput(output=outcome.get("output"), logs=logs, is_final_answer=False)
