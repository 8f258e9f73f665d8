"""The SWE-smith oracle: a deterministic `ChatModel` that knows every instance's bug and reverts it.

It finds the instance and its checkout in the prompt the env writes (environments/swe_smith/env.py).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from environments.check_agents import OneCallOracle
from environments.swe_smith.instances import SweSmithInstance

__all__ = ["OracleAgent"]


_INSTANCE_RE = re.compile(r"^Instance: (\S+)$", re.MULTILINE)
_PATH_RE = re.compile(r"^Repository path: (\S+)$", re.MULTILINE)


class OracleAgent(OneCallOracle):
    """Knows every instance's bug patch and applies it in reverse with one terminal call."""

    done = "Applied the fix; the failing tests pass now."
    unknown = "I do not know this instance."

    def __init__(self, instances: Mapping[str, SweSmithInstance]) -> None:
        self.instances = dict(instances)

    def arguments(self, prompt: str) -> dict[str, Any] | None:
        inst_match, path_match = _INSTANCE_RE.search(prompt), _PATH_RE.search(prompt)
        if not inst_match or not path_match or inst_match.group(1) not in self.instances:
            return None
        patch = self.instances[inst_match.group(1)].patch
        return {
            "command": f"cd {shlex.quote(path_match.group(1))} && git apply -R <<'HERMES_PATCH'\n{patch}HERMES_PATCH"
        }
