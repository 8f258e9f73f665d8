"""The runner's choice of garbage-collector settings while many trajectories run in one process.

With tens of thousands of concurrent trajectories, each turn's short-lived objects (coroutines,
task steps, futures) live for a whole round of the event loop, so CPython's young collections
promote them to the oldest generation, and its full collections, each of which walks every
live object of every trajectory, run again and again: at 10,000 trajectories they were most of
the wall time (bench/loop.py). The `throughput` profile freezes what exists at start-up (never
scanned again) and collects the middle generation rarely, so those objects die young.

Library code never touches the collector; a runner applies this, from its config, around its
run, and the previous settings come back afterwards:

    with collector(config.gc):
        await run_everything()
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["GCConfig", "collector"]


class GCConfig(BaseModel):
    profile: Literal["default", "throughput"] = Field(
        "default",
        description="default: CPython's own settings. throughput: freeze start-up objects and collect the middle "
        "generation every `middle_every` young collections (for thousands of concurrent trajectories)",
    )
    middle_every: int = Field(
        10_000, ge=1, description="throughput profile: young collections between two middle-generation collections"
    )


@contextmanager
def collector(config: GCConfig) -> Iterator[None]:
    """Apply `config` for the duration of the block; restores the previous thresholds after."""
    if config.profile == "default":
        yield
        return
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(before[0], config.middle_every, before[2])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
