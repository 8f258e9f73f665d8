"""The `terminal` toolset: run one shell command in the trajectory's workspace."""

from __future__ import annotations

import json
from typing import Any

from tools.context import ToolContext
from tools.registry import Tool, tool_error

__all__ = ["TERMINAL_TOOLS", "format_exec", "run_for_model"]


def format_exec(result, *, limit_chars: int) -> str:
    """The JSON the model sees for a finished (or killed) command."""
    payload: dict[str, Any] = {"output": result.output, "exit_code": result.exit_code}
    if result.truncated:
        payload["output"] += f"\n[output truncated at {limit_chars} characters]"
        payload["truncated"] = True
    if result.timed_out:
        payload["error"] = f"command timed out after {result.duration_s:.1f}s and was killed (with its child processes)"
    return json.dumps(payload, ensure_ascii=False)


async def run_for_model(ctx: ToolContext, command: str, *, timeout: float, stdin: str | None = None) -> str:
    """`command` run by the trajectory's executor under its output limit, as the JSON the model sees."""
    limit = ctx.limits.max_output_chars
    result = await ctx.executor.exec(command, timeout=timeout, max_output_bytes=limit, stdin=stdin)
    return format_exec(result, limit_chars=limit)


async def _terminal(args: dict[str, Any], ctx: ToolContext) -> str:
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        return tool_error("'command' must be a non-empty string")
    timeout = args.get("timeout", ctx.limits.default_timeout_s)
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        return tool_error(f"'timeout' must be a number of seconds, got {timeout!r}")
    return await run_for_model(ctx, command, timeout=max(0.1, min(timeout, ctx.limits.max_timeout_s)))


TERMINAL_TOOLS = [
    Tool(
        name="terminal",
        toolset="terminal",
        description=(
            "Run a bash command in your workspace directory and return its combined stdout/stderr "
            "and exit code. Commands that run longer than the timeout are killed."
        ),
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command to run."},
                "timeout": {"type": "number", "description": "Seconds before the command is killed (optional)."},
            },
            "required": ["command"],
        },
        handler=_terminal,
    )
]
