"""The built-in tools on a real local workspace: processes, files, limits."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest

from model_tools import default_registry, get_tool_definitions, handle_function_call
from tools.context import ToolContext, ToolLimits
from tools.executor import LocalWorkspace


@pytest.fixture
def ctx(tmp_path):
    return ToolContext(LocalWorkspace(tmp_path / "ws"), ToolLimits(max_output_chars=2000, default_timeout_s=10))


async def call(ctx, name, args):
    return json.loads(await handle_function_call(name, args, ctx))


def _survivors(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


async def test_terminal_runs_in_workspace(ctx):
    out = await call(ctx, "terminal", {"command": "pwd; echo err >&2; exit 3"})
    assert out["exit_code"] == 3
    assert out["output"].splitlines() == [ctx.executor.workspace, "err"]


async def test_timeout_kills_the_whole_process_tree(ctx, tmp_path):
    # pids inside the command's pid namespace differ from ours: find by a name unique on the machine
    marker = f"hermes-{uuid.uuid4().hex}"
    sleeper = f"bash -c 'sleep 300; :' {marker}"
    cmd = f"({sleeper} & echo $! >> pids; wait) & (setsid {sleeper} &) ; {sleeper} & echo $! >> pids; wait"
    t0 = time.monotonic()
    out = await call(ctx, "terminal", {"command": cmd, "timeout": 1})
    assert time.monotonic() - t0 < 60  # the timeout ended it, not the 300 s sleeps (slack for a loaded CI)
    assert out["exit_code"] is None and "timed out" in out["error"]
    assert len((tmp_path / "ws" / "pids").read_text().split()) == 2
    time.sleep(0.2)
    assert not _survivors(marker), "a grandchild survived the timeout"


async def test_background_child_of_a_finished_command_is_reaped(ctx, tmp_path):
    marker = f"hermes-{uuid.uuid4().hex}"
    out = await call(ctx, "terminal", {"command": f"bash -c 'sleep 300; :' {marker} & echo started"})
    assert out["output"] == "started\n" and out["exit_code"] == 0
    time.sleep(0.2)
    assert not _survivors(marker)


async def test_output_is_capped_and_says_so(ctx):
    out = await call(ctx, "terminal", {"command": "yes abcdefgh | head -c 100000"})
    assert out["truncated"] is True
    assert "[output truncated at 2000 characters]" in out["output"]
    assert len(out["output"]) < 2100


async def test_python_tool(ctx):
    out = await call(ctx, "python", {"code": "import sys\nprint(sum(range(10)))\nprint('e', file=sys.stderr)"})
    assert out["output"] == "45\ne\n" and out["exit_code"] == 0
    err = await call(ctx, "python", {"code": "1/0"})
    assert err["exit_code"] == 1 and "ZeroDivisionError" in err["output"]


async def test_python_snippet_timeout(tmp_path):
    ctx = ToolContext(LocalWorkspace(tmp_path / "ws"), ToolLimits(python_timeout_s=1))
    out = await call(ctx, "python", {"code": "import time\ntime.sleep(30)"})
    assert out["exit_code"] is None and "timed out" in out["error"]


async def test_write_read_with_offsets(ctx):
    body = "".join(f"line {i}\n" for i in range(1, 11))
    assert (await call(ctx, "write_file", {"path": "d/f.txt", "content": body}))["bytes_written"] == len(body)
    out = await call(ctx, "read_file", {"path": "d/f.txt", "offset": 3, "limit": 2})
    assert out["content"] == "     3|line 3\n     4|line 4" and out["total_lines"] == 10
    assert "offset" in out["note"]


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../x"])
async def test_paths_outside_workspace_are_refused(ctx, path):
    for name, args in [("read_file", {"path": path}), ("write_file", {"path": path, "content": "x"})]:
        out = await call(ctx, name, args)
        assert "outside the workspace" in out["error"], (name, out)


async def test_symlink_out_of_workspace_is_refused(ctx, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    os.symlink(secret, os.path.join(ctx.executor.workspace, "link.txt"))
    out = await call(ctx, "read_file", {"path": "link.txt"})
    assert "outside the workspace" in out["error"]
    out = await call(ctx, "write_file", {"path": "link.txt", "content": "overwrite"})
    assert "outside the workspace" in out["error"] and secret.read_text() == "top secret"


async def test_patch_semantics(ctx):
    await call(ctx, "write_file", {"path": "m.py", "content": "a = 1\nb = 1\nc = 2\n"})
    out = await call(ctx, "patch", {"path": "m.py", "old_string": "= 1", "new_string": "= 9"})
    assert "occurs 2 times" in out["error"]
    out = await call(ctx, "patch", {"path": "m.py", "old_string": "zzz", "new_string": "y"})
    assert "not found" in out["error"]
    out = await call(ctx, "patch", {"path": "m.py", "old_string": "b = 1", "new_string": "b = 5"})
    assert out["replacements"] == 1
    out = await call(ctx, "patch", {"path": "m.py", "old_string": "= ", "new_string": "== ", "replace_all": True})
    assert out["replacements"] == 3
    assert (await ctx.read_file("m.py")) == "a == 1\nb == 5\nc == 2\n"
    out = await call(ctx, "patch", {"path": "missing.py", "old_string": "a", "new_string": "b"})
    assert "file not found" in out["error"]


async def test_search_content_and_files(ctx):
    await call(ctx, "write_file", {"path": "src/a.py", "content": "def foo():\n    return 1\n"})
    await call(ctx, "write_file", {"path": "src/b.txt", "content": "foo bar\n"})
    await call(ctx, "write_file", {"path": "docs/c.md", "content": "nothing\n"})
    out = await call(ctx, "search_files", {"pattern": "fo+"})
    assert sorted(out["matches"]) == ["./src/a.py:1:def foo():", "./src/b.txt:1:foo bar"]
    out = await call(ctx, "search_files", {"pattern": "foo", "file_glob": "*.py"})
    assert out["matches"] == ["./src/a.py:1:def foo():"]
    out = await call(ctx, "search_files", {"pattern": "*.md", "target": "files"})
    assert out["matches"] == ["./docs/c.md"]
    out = await call(ctx, "search_files", {"pattern": "o", "max_results": 1})
    assert out["count"] == 1 and out["truncated"] is True
    out = await call(ctx, "search_files", {"pattern": "x", "path": "../"})
    assert "leaves the workspace" in out["error"]
    out = await call(ctx, "search_files", {"pattern": "absent-token"})
    assert out["matches"] == [] and out["count"] == 0


async def test_result_cap_and_error_contract(ctx):
    out = await call(ctx, "terminal", {})
    assert "missing required argument" in out["error"]
    out = await call(ctx, "terminal", {"command": "echo hi", "timeout": "soon"})
    assert "timeout" in out["error"]
    out = await call(ctx, "read_file", {"path": "nope.txt"})
    assert out["error"] == "file not found: 'nope.txt'"


def test_definitions_and_toolset_selection():
    names = {d["function"]["name"] for d in get_tool_definitions()}
    assert names >= {"terminal", "read_file", "write_file", "patch", "search_files", "python"}
    assert [d["function"]["name"] for d in get_tool_definitions(["python"])] == ["python"]
    assert "python" not in {d["function"]["name"] for d in get_tool_definitions(disabled_toolsets=["python"])}
    with pytest.raises(ValueError, match="known toolsets"):
        get_tool_definitions(["nope"])
    with pytest.raises(ValueError, match="already registered"):
        default_registry().register(default_registry().get("python"))


async def test_backgrounded_child_does_not_stall_a_finished_command(ctx):
    # the same case through sandbox_server: tests/sandbox/test_server.py (one runner for both)
    t0 = time.monotonic()
    out = await call(ctx, "terminal", {"command": "sleep 20 & echo hi", "timeout": 8})
    assert out == {"output": "hi\n", "exit_code": 0}
    assert time.monotonic() - t0 < 4
