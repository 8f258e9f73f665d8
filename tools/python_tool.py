"""The `python` toolset: run a Python snippet and return what it printed."""

from __future__ import annotations

from typing import Any

from tools.context import ToolContext
from tools.registry import Tool, tool_error
from tools.terminal import format_exec

__all__ = ["PYTHON_TOOLS"]


async def _python(args: dict[str, Any], ctx: ToolContext) -> str:
    code = args.get("code")
    if not isinstance(code, str) or not code.strip():
        return tool_error("'code' must be a non-empty string of Python source")
    limit = ctx.limits.max_output_chars
    # The program goes in on stdin: nothing is written into the workspace.
    result = await ctx.executor.exec(
        ctx.executor.python, timeout=ctx.limits.python_timeout_s, max_output_bytes=limit, stdin=code
    )
    return format_exec(result, limit_chars=limit)


PYTHON_TOOLS = [
    Tool(
        name="python",
        toolset="python",
        description=(
            "Execute a Python 3 program and return everything it printed (stdout and stderr). "
            "Use print() to see values; each call starts a fresh interpreter."
        ),
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source code to run."}},
            "required": ["code"],
        },
        handler=_python,
    )
]
