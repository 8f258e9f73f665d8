"""sandbox_server is copied into the image alone: it may import only the stdlib, aiohttp, pydantic and uvloop."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import sandbox_server

ALLOWED = set(sys.stdlib_module_names) | {"aiohttp", "pydantic", "uvloop", "sandbox_server"}


def test_sandbox_server_imports_nothing_else_of_the_project():
    pkg = Path(sandbox_server.__file__).parent
    requirements = {
        line.split(">")[0].split("=")[0].strip() for line in (pkg / "requirements.txt").read_text().splitlines() if line
    }
    assert requirements == {"aiohttp", "pydantic", "uvloop"}
    seen = set()
    for path in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                seen |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                seen.add(node.module.split(".")[0])
    assert seen and seen <= ALLOWED, seen - ALLOWED
