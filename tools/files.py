"""The `file` toolset: read_file, write_file, patch, search_files.

Reading and writing go through the executor's file calls (which confine paths to the
workspace); search runs grep/find through the executor, so it works the same in a
local workspace and in a sandbox slot.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from typing import Any

from tools.context import ToolContext
from tools.executor import FileOpError, WorkspaceEscapeError
from tools.registry import Tool, tool_error

__all__ = ["FILE_TOOLS"]

_MAX_READ_LINES = 2000


def _str_arg(args: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    value = args.get(key)
    if not isinstance(value, str) or (not allow_empty and not value):
        raise ValueError(f"'{key}' must be a {'string' if allow_empty else 'non-empty string'}")
    return value


def _int_arg(args: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < minimum:
        raise ValueError(f"'{key}' must be an integer >= {minimum}, got {value!r}")
    return int(value)


async def _read_file(args: dict[str, Any], ctx: ToolContext) -> str:
    try:
        path = _str_arg(args, "path")
        offset = _int_arg(args, "offset", 1, 1)
        limit = _int_arg(args, "limit", _MAX_READ_LINES, 1)
    except ValueError as exc:
        return tool_error(str(exc))
    try:
        data = await ctx.executor.read_file(path)
    except IsADirectoryError:
        return tool_error(f"{path!r} is a directory; use search_files with target='files' to list it")
    except FileNotFoundError:
        return tool_error(f"file not found: {path!r}")
    except FileOpError as exc:
        return tool_error(str(exc))
    if b"\x00" in data[:8192]:
        return tool_error(f"{path!r} is a binary file ({len(data)} bytes); read it with the python or terminal tool")
    lines = data.decode("utf-8", errors="replace").splitlines()
    limit = min(limit, _MAX_READ_LINES)
    chunk = lines[offset - 1 : offset - 1 + limit]
    numbered = "\n".join(f"{i:6d}|{line}" for i, line in enumerate(chunk, start=offset))
    payload: dict[str, Any] = {"content": numbered, "total_lines": len(lines)}
    if offset - 1 + limit < len(lines):
        payload["note"] = f"showing lines {offset}-{offset + len(chunk) - 1}; pass offset to read more"
    return json.dumps(payload, ensure_ascii=False)


async def _write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    try:
        path = _str_arg(args, "path")
        content = _str_arg(args, "content", allow_empty=True)
    except ValueError as exc:
        return tool_error(str(exc))
    data = content.encode()
    try:
        await ctx.executor.write_file(path, data)
    except (FileOpError, IsADirectoryError, NotADirectoryError) as exc:
        return tool_error(str(exc))
    return json.dumps({"path": path, "bytes_written": len(data)})


async def _patch(args: dict[str, Any], ctx: ToolContext) -> str:
    try:
        path = _str_arg(args, "path")
        old = _str_arg(args, "old_string")
        new = _str_arg(args, "new_string", allow_empty=True)
    except ValueError as exc:
        return tool_error(str(exc))
    replace_all = bool(args.get("replace_all", False))
    try:
        text = (await ctx.executor.read_file(path)).decode("utf-8")
    except FileNotFoundError:
        return tool_error(f"file not found: {path!r}; create it with write_file")
    except FileOpError as exc:
        return tool_error(str(exc))
    except UnicodeDecodeError:
        return tool_error(f"{path!r} is not UTF-8 text and cannot be patched")
    count = text.count(old)
    if count == 0:
        return tool_error(f"old_string was not found in {path!r}; read the file and copy the exact text")
    if count > 1 and not replace_all:
        return tool_error(
            f"old_string occurs {count} times in {path!r}; add surrounding lines to make it unique "
            "or pass replace_all=true"
        )
    updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    try:
        await ctx.executor.write_file(path, updated.encode())
    except FileOpError as exc:
        return tool_error(str(exc))
    return json.dumps({"path": path, "replacements": count if replace_all else 1})


def _search_root(path: str, workspace: str) -> str:
    """Refuse search roots that leave the workspace (grep/find do not follow symlinks here)."""
    norm = posixpath.normpath(path)
    if posixpath.isabs(norm):
        ws = posixpath.normpath(workspace)
        if norm != ws and not norm.startswith(ws + "/"):
            raise WorkspaceEscapeError(f"path {path!r} is outside the workspace {workspace!r}")
    elif norm == ".." or norm.startswith("../"):
        raise WorkspaceEscapeError(f"path {path!r} leaves the workspace")
    # find takes a leading '-' as an expression (-delete!): a relative path always starts with ./
    return norm if posixpath.isabs(norm) or norm == "." else "./" + norm


def _inside_workspace(root: str) -> str:
    """Shell words refusing a search root that resolves (through a symlink) outside the workspace."""
    q = shlex.quote(root)
    return (
        f'r=$(realpath -e -- {q} 2>/dev/null) || {{ echo "search_files: no such path: "{q} >&2; exit 2; }}; '
        f'case "$r" in "$PWD"|"$PWD"/*) ;; *) echo "search_files: "{q}" leads outside the workspace" >&2; exit 2;; esac; '
    )


async def _search_files(args: dict[str, Any], ctx: ToolContext) -> str:
    try:
        pattern = _str_arg(args, "pattern")
        root = _search_root(args.get("path") or ".", ctx.executor.workspace)
        max_results = _int_arg(args, "max_results", 50, 1)
    except (ValueError, WorkspaceEscapeError) as exc:
        return tool_error(str(exc))
    target = args.get("target", "content")
    if target == "files":
        # pattern is a shell glob on file names
        cmd = f"find {shlex.quote(root)} -type f -name {shlex.quote(pattern)} -not -path '*/.git/*' | sort | head -n {max_results + 1}"
    elif target == "content":
        glob = args.get("file_glob")
        include = f"--include={shlex.quote(glob)} " if isinstance(glob, str) and glob else ""
        # -I skips binary files, -E takes an extended regular expression
        cmd = (
            f"grep -rnIE --exclude-dir=.git {include}-e {shlex.quote(pattern)} -- {shlex.quote(root)} "
            f"| head -n {max_results + 1}"
        )
    else:
        return tool_error(f"'target' must be 'content' or 'files', got {target!r}")
    result = await ctx.terminal(_inside_workspace(root) + cmd)
    if "search_files: " in result.output and result.exit_code == 2:
        return tool_error(result.output.strip().splitlines()[-1].removeprefix("search_files: "))
    if result.timed_out:
        return tool_error("search timed out; narrow the path or the pattern")
    lines = [line for line in result.output.splitlines() if line]
    if target == "content" and not lines and "grep:" in result.output:
        return tool_error(result.output.strip())
    payload: dict[str, Any] = {"matches": lines[:max_results], "count": min(len(lines), max_results)}
    if len(lines) > max_results:
        payload["truncated"] = True
        payload["note"] = f"more than {max_results} results; narrow the search or raise max_results"
    return json.dumps(payload, ensure_ascii=False)


FILE_TOOLS = [
    Tool(
        name="read_file",
        toolset="file",
        description="Read a text file in the workspace. Lines come back numbered ('   12|text').",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace."},
                "offset": {"type": "integer", "description": "First line to return (1-based).", "minimum": 1},
                "limit": {"type": "integer", "description": "Maximum number of lines.", "minimum": 1},
            },
            "required": ["path"],
        },
        handler=_read_file,
    ),
    Tool(
        name="write_file",
        toolset="file",
        description="Create or overwrite a file in the workspace with the given content.",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace."},
                "content": {"type": "string", "description": "The complete new content of the file."},
            },
            "required": ["path", "content"],
        },
        handler=_write_file,
    ),
    Tool(
        name="patch",
        toolset="file",
        description=(
            "Replace an exact piece of text in a file. old_string must occur exactly once unless replace_all is true."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old_string": {"type": "string", "description": "Exact text to replace."},
                "new_string": {"type": "string", "description": "Replacement text."},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence."},
            },
            "required": ["path", "old_string", "new_string"],
        },
        handler=_patch,
    ),
    Tool(
        name="search_files",
        toolset="file",
        description=(
            "Search the workspace. target='content' (default): lines matching an extended regular "
            "expression, as path:line:text. target='files': file names matching a glob such as '*.py'."
        ),
        parameters={
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regex (content) or glob (files)."},
                "path": {"type": "string", "description": "Directory to search, default '.'."},
                "target": {"type": "string", "enum": ["content", "files"]},
                "file_glob": {"type": "string", "description": "Only search files matching this glob (content)."},
                "max_results": {"type": "integer", "minimum": 1},
            },
            "required": ["pattern"],
        },
        handler=_search_files,
    ),
]
