"""One τ² conversation: the agent (the built-in tool-calling loop) and the simulated user take turns.

The orchestration follows the benchmark's half-duplex order: the agent opens with a fixed
greeting (shown to the user simulator only: it is not the policy's output, so it is not in the
agent's messages); the user answers; then the agent works (tool calls against the episode's own
database, run in-process) until it says something, the user answers that, and so on until the
user's reply carries a stop token, the agent writes ###STOP###, or a limit is hit. The agent's
turn budget (`max_agent_turns`) and time budget hold for the whole conversation.

User turns are appended as `user` messages. In token mode the agent's model client renders them
as template text between its own generations (never trained, never sampled); the simulator's
requests go to its own client and never reach the agent's token session.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from environments.agent_loop import AgentLoopConfig, AgentResult, HermesAgentLoop, StopReason
from environments.errors import HermesEnvError
from environments.models.base import ChatModel, ModelError, ModelRequestError
from environments.tau.domain import Domain
from environments.tau.scoring import TauScore, initial_db
from environments.tau.tasks import DomainData, Task
from environments.tau.user_sim import GREETING, UserSimulator, stop_token
from tools.context import ToolContext
from tools.registry import Tool, ToolRegistry, tool_error

__all__ = ["AGENT_STOP", "TauConversation", "TauResult", "domain_tools"]

AGENT_STOP = "###STOP###"


@dataclass
class TauResult(AgentResult):
    """The loop's result plus what the benchmark's evaluation needs: the final database and how it ended."""

    db: dict[str, Any] = field(default_factory=dict)
    ended: str = "not_started"  # user_stop | agent_stop | max_user_turns | user_model_error | the loop's stop reason
    stop_token: str | None = None
    user_turns: int = 0
    score_detail: TauScore | None = None  # set by the env when it scores the conversation


def domain_tools(domain: Domain, db: dict[str, Any] | None) -> list[Tool]:
    """The domain's tools as registry tools on `db` (None: schemas only, for the offered tool list)."""

    def bind(name: str):
        async def handler(args: dict[str, Any], ctx: ToolContext) -> str:
            if db is None:
                return tool_error(f"{name} runs only inside a τ² conversation (it needs the episode's database)")
            try:
                result = domain.call(db, name, args)
            except ValueError as exc:  # the tool refused: the agent reads why, as the benchmark's does
                return tool_error(str(exc))
            return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)

        return handler

    return [
        Tool(t.name, f"tau2_{domain.name}", t.description, t.parameters, bind(t.name)) for t in domain.tools.values()
    ]


class TauConversation:
    """An `Agent` (environments/runtime.py) for one task; create one per trajectory."""

    def __init__(
        self,
        *,
        model: ChatModel,
        tools: list[dict[str, Any]],
        context: ToolContext,
        loop: AgentLoopConfig,
        task: Task,
        domain: Domain,
        data: DomainData,
        user: UserSimulator,
        max_user_turns: int,
    ) -> None:
        self.model, self.tools, self.context, self.loop = model, tools, context, loop
        self.task, self.domain, self.data, self.user = task, domain, data, user
        self.max_user_turns = max_user_turns

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult:
        clock = asyncio.get_running_loop().time
        started = clock()
        # A copy of the domain's database (the published retail one is ~3 MB): off the event loop.
        db = await asyncio.to_thread(initial_db, self.task, self.domain, self.data.db)
        registry = ToolRegistry(domain_tools(self.domain, db))
        messages = list(messages)
        result = TauResult(messages, 0, False, "finished", [], [], db=db)
        said = GREETING
        while True:
            if result.user_turns >= self.max_user_turns:
                return self._end(result, "max_turns", "max_user_turns", started)
            try:
                reply = await self.user.reply(said)
            except ModelRequestError as exc:  # a 4xx: the simulator's settings are wrong for every conversation
                raise HermesEnvError(
                    f"the user simulator's server refused the request: {exc}; check --env.user_model.*"
                ) from exc
            except ModelError as exc:  # the simulator's server, not the agent: never the agent's score
                result.error = f"the user simulator failed: {exc}"
                return self._end(result, "infrastructure_error", "user_model_error", started)
            result.user_turns += 1
            messages.append({"role": "user", "content": reply})
            if token := stop_token(reply):
                result.stop_token = token
                return self._end(result, "finished", "user_stop", started)
            left = self.loop.max_turns - result.turns_used
            budget = self.loop.time_budget_s - (clock() - started)
            if left <= 0 or budget <= 0:
                reason: StopReason = "max_turns" if left <= 0 else "time_budget"
                return self._end(result, reason, reason, started)
            part = await HermesAgentLoop(
                self.model,
                self.tools,
                self.context,
                self.loop.model_copy(update={"max_turns": left, "time_budget_s": budget}),
                registry,
            ).run(messages)
            offset = result.turns_used
            for turn in part.turns:
                turn.index += offset
            for error in part.tool_errors:
                error.turn += offset
            result.turns.extend(part.turns)
            result.tool_errors.extend(part.tool_errors)
            result.turns_used += part.turns_used
            messages = result.messages = part.messages
            if part.stop_reason != "finished":
                result.error = part.error
                return self._end(result, part.stop_reason, part.stop_reason, started)
            said = part.final_response or ""
            if AGENT_STOP in said:
                return self._end(result, "finished", "agent_stop", started)

    @staticmethod
    def _end(result: TauResult, reason: StopReason, ended: str, started: float) -> TauResult:
        result.stop_reason = reason
        result.finished_naturally = reason == "finished"
        result.ended = ended
        result.duration_s = asyncio.get_running_loop().time() - started
        return result
