"""The `python` toolset: run a Python snippet and return what it printed."""

from __future__ import annotations

from typing import Any

from tools.context import ToolContext
from tools.registry import Tool, tool_error
from tools.terminal import run_for_model

__all__ = ["PYTHON_TOOLS"]


async def _python(args: dict[str, Any], ctx: ToolContext) -> str:
    code = args.get("code")
    if not isinstance(code, str) or not code.strip():
        return tool_error("'code' must be a non-empty string of Python source")
    # The program goes in on stdin: nothing is written into the workspace.
    return await run_for_model(ctx, ctx.executor.python, timeout=ctx.limits.python_timeout_s, stdin=code)


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
