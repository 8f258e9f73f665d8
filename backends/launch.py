"""Starting several sandboxes at once: all of them, or none left running by the launch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from slots.client import SandboxAddress

__all__ = ["launch_all"]


async def launch_all(
    count: int,
    one: Callable[[], Awaitable[SandboxAddress]],
    undo: Callable[[SandboxAddress], Awaitable[object]] | None = None,
) -> list[SandboxAddress]:
    """`count` sandboxes started concurrently by `one()`. When any start fails, the first error is
    raised, after `undo` (when given) has ended the ones that did start."""
    results = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        if undo is not None:
            await asyncio.gather(*(undo(r) for r in results if isinstance(r, SandboxAddress)))
        raise errors[0]
    return [r for r in results if isinstance(r, SandboxAddress)]
