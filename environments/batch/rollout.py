"""One prompt of batch_runner through the shared runtime (local workers and Ray actors alike)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from environments.batch.config import DEFAULT_SYSTEM_PROMPT, BatchConfig, BatchError, Prompt, sample_toolsets
from environments.batch.output import Progress, result_record
from environments.runtime import AgentRuntime, Rollout


class Runner:
    """One prompt at a time through the shared runtime; infrastructure failures are retried there."""

    def __init__(self, config: BatchConfig, runtime: AgentRuntime, agent: Any = None) -> None:
        self.config = config
        self.runtime = runtime
        self.codeact = agent  # CodeAct: (CodeActConfig for the prompt's toolsets, thread pool)

    async def run_prompt(self, prompt: Prompt, progress: Progress) -> tuple[dict[str, Any] | None, str | None, int]:
        """(record, None, attempts) on an outcome of the model's; (None, error, attempts) when infrastructure failed every try."""
        c = self.config
        toolsets = (
            prompt.toolsets if prompt.toolsets is not None else sample_toolsets(c.distribution, prompt.id, c.seed)
        )
        tools = self.runtime.tool_schemas(toolsets)
        messages = [{"role": "system", "content": c.system_prompt}, {"role": "user", "content": prompt.text}]
        factory = None
        if self.codeact is not None:
            factory = self.codeact(toolsets)
            tools = []  # CodeAgent describes its tools in its own system prompt
            if c.system_prompt == DEFAULT_SYSTEM_PROMPT:  # a tool-calling prompt; a custom one becomes instructions
                messages = messages[1:]
        rollout: Rollout = await self.runtime.rollout(
            messages,
            tools,
            item=prompt,
            task_id=prompt.id,
            attempts=c.rollout_infra_retries + 1,
            backoff_s=c.retry_backoff_s,
            agent=factory,
        )
        progress.retries += rollout.attempts - 1
        if rollout.infrastructure_failure or rollout.result is None:
            return None, rollout.error or "infrastructure failure", rollout.attempts
        record = result_record(
            prompt, toolsets, tools, rollout.result, rollout.attempts, c.model, rollout.extras.get("token_trace")
        )
        if self.codeact is not None:
            result: Any = rollout.result
            record["code_actions"] = result.code_actions
            record["final_answer"] = result.final_answer if result.has_final_answer else None
            record["callouts"] = result.callouts
        return record, None, rollout.attempts


def codeact_agents(runtime: AgentRuntime, pool: Any) -> Callable[[list[str]], Any]:
    """toolsets -> the CodeAgent factory for a prompt: web as a host call-out when offered, the rest in the workspace."""
    try:
        from environments.smolagents_gaia.agent import CodeActAgentRun, CodeActConfig
        from environments.smolagents_gaia.executor import WebExtractTool, WebSearchTool
    except ModuleNotFoundError as exc:
        if exc.name != "smolagents":
            raise
        raise BatchError("--agent codeact needs smolagents: pip install 'hermes-rl[codeact]'") from exc

    def for_toolsets(toolsets: list[str]) -> Any:
        web = "web" in toolsets and runtime.registry.get("web_search") is not None
        config = CodeActConfig(
            host_tools=[WebSearchTool(), WebExtractTool()] if web else [],
            instructions=None,
            max_callouts=8,
            planning_interval=None,
        )
        return lambda model, tools, ctx, loop, registry: CodeActAgentRun(model, ctx, loop, registry, config, pool)

    return for_toolsets
