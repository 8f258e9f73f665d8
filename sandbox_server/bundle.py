"""Where this server runs from: a normal Python (the local backend) or the self-contained runtime.

The runtime (scripts/build_sandbox_runtime.sh, backends/runtime.py) is a directory with its own
loader, libraries and Python; its `sandbox-server` launcher starts this package with
`-X hermes_runtime=<dir>`. Run from it, the server uses nothing of the image it runs in but
bash and the image's tools for the commands: the slot's exec server runs on the runtime's
Python (mounted where only the slot's root can reach it), and the slots see the image's own
PATH and python3, never ours.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SLOT_PATH", "Runtime", "current_runtime", "image_python"]

XOPTION = "hermes_runtime"
# The PATH of every slot command, after the local backend's interpreter directory if any.
SLOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Runtime:
    dir: Path
    loader: str  # the dynamic loader's file name in lib/

    @property
    def launcher(self) -> Path:
        return self.dir / "sandbox-server"

    @property
    def spawn_helper(self) -> Path:
        return self.dir / "hermes-spawn"

    def python_argv(self, at: str) -> list[str]:
        """The runtime's Python, run through its own loader, with the runtime directory mounted at `at`."""
        return [f"{at}/lib/{self.loader}", "--library-path", f"{at}/lib", f"{at}/python/bin/python3"]


def current_runtime() -> Runtime | None:
    """The runtime this process runs from, or None under a normal Python."""
    where = sys._xoptions.get(XOPTION)
    if not isinstance(where, str) or not where:
        return None
    root = Path(where)
    manifest = json.loads((root / "manifest.json").read_text())
    return Runtime(root, manifest["loader"])


def image_python() -> str | None:
    """The image's own python3 (or python) as the slots find it on their PATH; None if it has none."""
    return shutil.which("python3", path=SLOT_PATH) or shutil.which("python", path=SLOT_PATH)
