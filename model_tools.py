"""The project's tool surface: schemas for the model and one entry point to run a call.

    get_tool_definitions(enabled_toolsets=["python"])  -> OpenAI `tools=` list
    await handle_function_call("python", {"code": "print(1)"}, context) -> str

The default registry is built once, from the built-in toolsets, and never mutated;
pass your own `ToolRegistry` to add tools.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

from tools.context import ToolContext, ToolLimits
from tools.executor import LocalWorkspace, ToolExecutor
from tools.files import FILE_TOOLS
from tools.python_tool import PYTHON_TOOLS
from tools.registry import Tool, ToolRegistry
from tools.terminal import TERMINAL_TOOLS

__all__ = [
    "Tool",
    "ToolContext",
    "ToolExecutor",
    "ToolLimits",
    "ToolRegistry",
    "LocalWorkspace",
    "builtin_tools",
    "default_registry",
    "get_tool_definitions",
    "handle_function_call",
]


def builtin_tools() -> list[Tool]:
    return [*TERMINAL_TOOLS, *FILE_TOOLS, *PYTHON_TOOLS]


@cache
def default_registry() -> ToolRegistry:
    return ToolRegistry(builtin_tools())


def get_tool_definitions(
    enabled_toolsets: Iterable[str] | None = None,
    disabled_toolsets: Iterable[str] | None = None,
    registry: ToolRegistry | None = None,
) -> list[dict[str, Any]]:
    return (registry or default_registry()).definitions(enabled_toolsets, disabled_toolsets)


async def handle_function_call(
    name: str,
    args: dict[str, Any] | str | None,
    context: ToolContext,
    registry: ToolRegistry | None = None,
) -> str:
    """Run one tool call. Always returns a string; failures are JSON with an `error` field."""
    return await (registry or default_registry()).call(name, args, context)
