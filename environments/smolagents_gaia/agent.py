"""One trajectory of smolagents' CodeAgent, as an `Agent` of the runtime (async `run(messages) -> AgentResult`).

CodeAgent is synchronous: it runs in a worker thread of a bounded pool the env owns, and
its model calls and code actions are bridged back onto the event loop (`Bridge`). The
result keeps the code actions (assistant turns) and observations (user turns) of the last
prompt, the executor's final answer, and one `TurnRecord` per model call.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import smolagents
from smolagents import CodeAgent
from smolagents.memory import ActionStep, PlanningStep
from smolagents.models import MessageRole
from smolagents.monitoring import LogLevel

from environments.agent_loop import AgentLoopConfig, AgentResult, StopReason, TurnRecord
from environments.models.base import ChatModel, ModelError, ModelRequestError
from environments.models.token_mode.session import TokenTrace
from tools.context import ToolContext
from tools.registry import ToolRegistry

from .executor import Bridge, HostTool, OutOfTime, SlotPythonExecutor
from .model import CapturingModel, plain_messages

__all__ = ["CodeActConfig", "CodeActResult", "CodeActAgentRun", "SMOLAGENTS_VERSION"]

SMOLAGENTS_VERSION = smolagents.__version__


@dataclass
class CodeActConfig:
    host_tools: list[HostTool]
    instructions: str | None
    max_callouts: int
    planning_interval: int | None


@dataclass
class CodeActResult(AgentResult):
    final_answer: Any = None
    has_final_answer: bool = False
    code_actions: list[str] = field(default_factory=list)
    steps: int = 0  # code actions run
    callouts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tool_call_count(self) -> int:
        return self.steps


class CodeActAgentRun:
    """Runs one CodeAgent trajectory; `token_trace()` gives its model calls' exact tokens."""

    def __init__(
        self,
        model: ChatModel,
        ctx: ToolContext,
        loop_config: AgentLoopConfig,
        registry: ToolRegistry,
        config: CodeActConfig,
        pool: Executor,
    ) -> None:
        self.chat_model = model
        self.ctx = ctx
        self.loop_config = loop_config
        self.registry = registry
        self.config = config
        self.pool = pool
        self.model: CapturingModel | None = None

    def token_trace(self) -> TokenTrace | None:
        return self.model.token_trace() if self.model is not None else None

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult:
        c = self.loop_config
        loop = asyncio.get_running_loop()
        started = loop.time()
        bridge = Bridge(loop, started + c.time_budget_s)
        model = self.model = CapturingModel(
            self.chat_model,
            bridge,
            temperature=c.temperature,
            max_tokens=c.max_tokens or 1024,
            timeout_s=c.model_timeout_s,
        )
        limits = self.ctx.limits
        executor = SlotPythonExecutor(
            self.ctx,
            bridge,
            self.registry,
            timeout_s=limits.python_timeout_s,
            max_output_chars=limits.max_output_chars,
            max_callouts=self.config.max_callouts,
        )
        task = "\n\n".join(str(m["content"]) for m in messages if m.get("role") == "user")
        system = next((str(m["content"]) for m in messages if m.get("role") == "system"), None)
        instructions = "\n\n".join(x for x in (system, self.config.instructions) if x) or None
        agent = CodeAgent(
            tools=list(self.config.host_tools),
            model=model,
            executor=executor,
            max_steps=c.max_turns,
            planning_interval=self.config.planning_interval,
            instructions=instructions,
            additional_authorized_imports=["*"],  # the slot confines the code, not an import list
            verbosity_level=LogLevel.OFF,
        )
        error: str | None = None
        reason: StopReason = "finished"
        try:
            await asyncio.wrap_future(self._submit(agent, task))
        except Exception as exc:
            cause: BaseException = exc.__cause__ or exc
            if isinstance(cause, ModelRequestError):
                raise cause from None  # a 4xx: the request is wrong for every rollout
            error = f"{type(cause).__name__}: {cause}"
            if bridge.infrastructure_error is not None:
                reason, error = "infrastructure_error", str(bridge.infrastructure_error)
            elif bridge.out_of_time or isinstance(cause, OutOfTime):
                reason = "time_budget"
            elif isinstance(cause, TimeoutError):
                reason = "model_timeout"
            elif isinstance(cause, ModelError):
                reason = "context_full" if "context length" in str(cause) else "model_error"
            else:
                raise
        finally:
            bridge.close()
        if reason == "finished" and bridge.infrastructure_error is not None:
            reason, error = "infrastructure_error", str(bridge.infrastructure_error)
        elif reason == "finished" and bridge.out_of_time:
            reason = "time_budget"
        elif reason == "finished" and not executor.has_final_answer:
            reason = "max_turns"
        return self._result(agent, model, executor, messages, reason, error, loop.time() - started)

    def _submit(self, agent: CodeAgent, task: str) -> Any:
        return self.pool.submit(agent.run, task)

    def _result(
        self,
        agent: CodeAgent,
        model: CapturingModel,
        executor: SlotPythonExecutor,
        opening: list[dict[str, Any]],
        reason: StopReason,
        error: str | None,
        duration: float,
    ) -> CodeActResult:
        messages = transcript(agent, model.calls[0].messages[:2] if model.calls else opening)
        turns = [
            TurnRecord(
                index=i,
                model_s=0.0,
                tools_s=0.0,
                tool_calls=(),
                finish_reason=call.finish_reason,
                usage=call.usage,
            )
            for i, call in enumerate(model.calls)
        ]
        actions = [s.code_action for s in agent.memory.steps if isinstance(s, ActionStep) and s.code_action]
        return CodeActResult(
            messages=messages,
            turns_used=len(model.calls),
            finished_naturally=reason == "finished",
            stop_reason=reason,
            turns=turns,
            tool_errors=[],
            error=error,
            duration_s=duration,
            final_answer=executor.final_answer,
            has_final_answer=executor.has_final_answer,
            code_actions=actions,
            steps=executor.actions,
            callouts=list(executor.callouts),
        )


def transcript(agent: CodeAgent, opening: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trajectory as one conversation: the opening (system, task), then each step's model output exactly as
    written (never smolagents' edited copy or its "Calling tools:" echo) and the observation it was shown."""
    messages = [dict(m) for m in opening]
    for step in agent.memory.steps:
        if not isinstance(step, (ActionStep, PlanningStep)) or step.model_output_message is None:
            continue
        raw = step.model_output_message.raw
        written = raw.get("text") if isinstance(raw, dict) else None
        messages.append({"role": "assistant", "content": written or str(step.model_output_message.content or "")})
        if isinstance(step, ActionStep):
            if step.is_final_answer:
                break  # the trajectory ends with the action that gave the answer
            shown = [m for m in step.to_messages() if m.role == MessageRole.TOOL_RESPONSE]
            messages.extend(plain_messages(shown))
        else:
            messages.extend(plain_messages(step.to_messages()[1:]))
    return messages
