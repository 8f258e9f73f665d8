"""What a tool handler (and a reward function) is handed: the executor plus limits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from tools.executor import ExecResult, ToolExecutor

__all__ = ["ToolLimits", "ToolContext"]


class ToolLimits(BaseModel):
    """Per-call limits; the env config carries one of these."""

    default_timeout_s: float = Field(30.0, gt=0, description="Timeout of a command when the model names none")
    max_timeout_s: float = Field(300.0, gt=0, description="Upper bound on a timeout the model asks for")
    max_output_chars: int = Field(20_000, gt=0, description="Cap on a command's captured output")
    python_timeout_s: float = Field(30.0, gt=0, description="Timeout of one python snippet")


@dataclass
class ToolContext:
    """One trajectory's handle on where its tools run.

    The same object is given to the env's reward function, so scoring can look at the
    files and run commands in the trajectory's own workspace or sandbox slot.
    """

    executor: ToolExecutor
    limits: ToolLimits = field(default_factory=ToolLimits)
    task_id: str = ""

    async def terminal(self, command: str, timeout: float | None = None) -> ExecResult:
        return await self.executor.exec(
            command,
            timeout=timeout or self.limits.default_timeout_s,
            max_output_bytes=self.limits.max_output_chars * 4,
        )

    async def read_file(self, path: str) -> str:
        return (await self.executor.read_file(path)).decode("utf-8", errors="replace")

    async def write_file(self, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        await self.executor.write_file(path, data)

    async def upload(self, local_path: str | Path, remote_path: str) -> None:
        """Copy a file from this machine into the workspace."""
        data = await asyncio.to_thread(Path(local_path).read_bytes)
        await self.executor.write_file(remote_path, data)

    async def download(self, remote_path: str, local_path: str | Path) -> Path:
        """Copy a file out of the workspace onto this machine."""
        data = await self.executor.read_file(remote_path)
        target = Path(local_path)

        def write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

        await asyncio.to_thread(write)
        return target
