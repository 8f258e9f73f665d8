"""One τ² conversation: the agent (the built-in tool-calling loop) and the simulated user take turns.

The orchestration is the benchmark's (its Orchestrator, half-duplex, with an LLM agent): the
agent opens with a fixed greeting, which is in the agent's context as its own first message
(`TauRules.hide_greeting` keeps it out); the user answers; then the agent works (tool calls
against the episode's own database, run in-process) until it says something, the user answers
that, and so on until the user's reply carries a stop token or a limit is hit. The agent cannot
end the run: a ###STOP### it writes is a message to the user (`TauRules.agent_stop` makes it end
and score the run). Limits, as the benchmark counts them: `max_steps` messages (each user or agent
message, and each round of tool results, is one step) and `max_errors` tool calls answered with an
error; either ends the run unscored. The loop's own turn and time budgets hold for the conversation.

User turns are appended as `user` messages. In token mode the agent's model client renders them
as template text between its own generations (never trained, never sampled); the simulator's
requests go to its own client and never reach the agent's token session.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from environments.agent_loop import AgentLoopConfig, AgentResult, HermesAgentLoop, StopReason
from environments.errors import HermesEnvError
from environments.models.base import ChatModel, ModelError, ModelRequestError
from environments.tau.domain import Domain
from environments.tau.scoring import TauScore, initial_db
from environments.tau.tasks import DomainData, Task
from environments.tau.user_sim import GREETING, UserSimulator, stop_token
from tools.context import ToolContext
from tools.registry import Tool, ToolRegistry, tool_error

__all__ = ["AGENT_STOP", "TauConversation", "TauResult", "TauRules", "domain_tools"]

AGENT_STOP = "###STOP###"


class TauRules(BaseModel):
    """How a conversation runs: the benchmark's defaults; each deliberate difference is a flag, off by default."""

    max_steps: int = Field(
        200, ge=1, description="Steps (user/agent messages, rounds of tool results) before the run ends unscored"
    )
    max_errors: int = Field(10, ge=1, description="Tool calls answered with an error before the run ends unscored")
    agent_stop: bool = Field(
        False, description="Deliberate difference: an agent message with ###STOP### ends and scores the run"
    )
    hide_greeting: bool = Field(
        False, description="Deliberate difference: keep the fixed greeting out of the agent's context"
    )


@dataclass
class TauResult(AgentResult):
    """The loop's result plus what the benchmark's evaluation needs: the final database and how it ended."""

    db: dict[str, Any] = field(default_factory=dict)
    # user_stop | agent_stop | max_steps | too_many_errors | max_user_turns | user_model_error | the loop's stop reason
    ended: str = "not_started"
    stop_token: str | None = None
    user_turns: int = 0
    score_detail: TauScore | None = None  # set by the env when it scores the conversation


@dataclass
class _Errors:
    count: int = 0


def domain_tools(domain: Domain, db: dict[str, Any] | None, errors: _Errors | None = None) -> list[Tool]:
    """The domain's tools as registry tools on `db` (None: schemas only, for the offered tool list).
    Answers are the benchmark's: a JSON dump of the result (a string as is), or `Error: <why>`."""

    def bind(name: str):
        async def handler(args: dict[str, Any], ctx: ToolContext) -> str:
            if db is None:
                return tool_error(f"{name} runs only inside a τ² conversation (it needs the episode's database)")
            try:
                result = domain.call(db, name, args)
            except ValueError as exc:  # the tool refused: the agent reads why, as the benchmark's does
                if errors is not None:
                    errors.count += 1
                return f"Error: {exc}"
            return result if isinstance(result, str) else json.dumps(result, default=str)

        return handler

    # Never truncated: the benchmark hands the agent a whole answer (a one-stop search can be long).
    return [
        Tool(t.name, f"tau2_{domain.name}", t.description, t.parameters, bind(t.name), max_result_chars=10**9)
        for t in domain.tools.values()
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
        rules: TauRules,
        max_user_turns: int | None = None,
        checked: ToolRegistry | None = None,
    ) -> None:
        """`checked`: a registry of the domain's tools (the env's), whose checked schemas the
        conversation's own registry reuses."""
        self.model, self.tools, self.context, self.loop = model, tools, context, loop
        self.task, self.domain, self.data, self.user = task, domain, data, user
        self.rules, self.max_user_turns, self.checked = rules, max_user_turns, checked

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult:
        clock = asyncio.get_running_loop().time
        started = clock()
        # A copy of the domain's database (the published retail one is ~3 MB): off the event loop.
        db = await asyncio.to_thread(initial_db, self.task, self.domain, self.data.db)
        errors = _Errors()
        registry = ToolRegistry(domain_tools(self.domain, db, errors), checked=self.checked)
        messages = list(messages)  # the env's prompt: the policy, then the greeting (TauEnv.format_prompt)
        result = TauResult(messages, 0, False, "finished", [], [], db=db)
        steps, said = 0, GREETING

        def limit(ended: str | None) -> str | None:
            """The benchmark's checks after a step that is not a tool call: steps, then errors (which win)."""
            if steps >= self.rules.max_steps:
                ended = "max_steps"
            if errors.count + len(result.tool_errors) >= self.rules.max_errors:
                ended = "too_many_errors"
            return ended

        while True:
            if self.max_user_turns is not None and result.user_turns >= self.max_user_turns:
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
            steps += 1
            messages.append({"role": "user", "content": reply})
            if token := stop_token(reply):
                result.stop_token = token
            if ended := limit("user_stop" if token else None):
                return self._end(result, "finished" if ended == "user_stop" else "max_turns", ended, started)
            while True:  # the agent's turn, one model call at a time (the limits are checked between calls)
                if result.turns_used >= self.loop.max_turns:
                    return self._end(result, "max_turns", "max_turns", started)
                budget = self.loop.time_budget_s - (clock() - started)
                if budget <= 0:
                    return self._end(result, "time_budget", "time_budget", started)
                part = await HermesAgentLoop(
                    self.model,
                    self.tools,
                    self.context,
                    self.loop.model_copy(update={"max_turns": 1, "time_budget_s": budget}),
                    registry,
                ).run(messages)
                self._merge(result, part)
                messages = result.messages = part.messages
                if part.stop_reason == "max_turns":  # one call with tool calls, answered: two steps
                    steps += 2
                    if ended := limit(None):
                        return self._end(result, "max_turns", ended, started)
                    continue
                if part.stop_reason != "finished":
                    result.error = part.error
                    return self._end(result, part.stop_reason, part.stop_reason, started)
                steps += 1
                said = part.final_response or ""
                stopped = "agent_stop" if self.rules.agent_stop and AGENT_STOP in said else None
                if ended := limit(stopped):
                    return self._end(result, "finished" if ended == "agent_stop" else "max_turns", ended, started)
                break

    @staticmethod
    def _merge(result: TauResult, part: AgentResult) -> None:
        offset = result.turns_used
        for turn in part.turns:
            turn.index += offset
        for error in part.tool_errors:
            error.turn += offset
        result.turns.extend(part.turns)
        result.tool_errors.extend(part.tool_errors)
        result.turns_used += part.turns_used

    @staticmethod
    def _end(result: TauResult, reason: StopReason, ended: str, started: float) -> TauResult:
        result.stop_reason = reason
        result.finished_naturally = reason == "finished"
        result.ended = ended
        result.duration_s = asyncio.get_running_loop().time() - started
        return result
