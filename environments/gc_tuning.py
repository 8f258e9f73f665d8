"""The runner's choice of garbage-collector settings while many trajectories run in one process.

With tens of thousands of concurrent trajectories, each turn's short-lived objects (coroutines,
task steps, timers) live for a whole round of the event loop. CPython collects its middle
generation every 7,000 net allocations, a small fraction of such a round, so those objects
are promoted to the oldest generation; its full collections, triggered by promotions (25% of
the old generation) and walking every live object of every trajectory, then run again and
again: most of the wall time at 10,000 trajectories (bench/loop.py).

Profiles:
- `scaled` (the default): freeze what exists at start-up (never scanned again), and collect
  the middle generation once per twice as many net allocations (`middle_share`) as the oldest
  generation holds objects (recounted after each full collection; never less often than
  CPython's default), so a round's objects die young at any scale. The oldest generation
  keeps CPython's own 25% rule, checked every second middle collection instead of every
  tenth. Trade-off: cyclic
  garbage waits longer, in proportion to the heap. In the worst case (every object becomes
  cyclic garbage after being promoted, tests/test_gc_tuning.py) it peaked at 2.0-2.5x the
  live objects (1.2-1.8x with `middle_share` 1); CPython's settings gave 0.6-1.8x there,
  `throughput` 3-18x.
- `cpython`: CPython's own settings.
- `throughput`: freeze, and a fixed, rare middle collection (`middle_every`); fastest, but
  cyclic garbage may wait for millions of allocations whatever the heap size.

Library code never touches the collector; a runner (the env's process/serve/evaluate,
batch_runner) applies its config around its run, and the previous settings come back after:

    with collector(config.gc):
        await run_everything()
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["GCConfig", "collector"]


class GCConfig(BaseModel):
    profile: Literal["scaled", "cpython", "throughput"] = Field(
        "scaled",
        description="scaled: the middle generation's period grows with the heap (flat throughput to 65,000 "
        "concurrent trajectories, cyclic garbage bounded by the heap size); cpython: CPython's own settings; "
        "throughput: collect the middle generation every `middle_every` young collections",
    )
    middle_share: float = Field(
        2.0,
        gt=0,
        description="scaled profile: net allocations between middle-generation collections, per object in the oldest "
        "generation (higher: faster with many trajectories, cyclic garbage waits longer)",
    )
    middle_every: int = Field(
        10_000, ge=1, description="throughput profile: young collections between two middle-generation collections"
    )


class _ScaledMiddle:
    """gc callback: after each full collection, the middle generation's period becomes `share` times the
    number of objects in the old generation (in net allocations)."""

    def __init__(self, young: int, floor: int, share: float) -> None:
        self.young, self.floor, self.share = young, floor, share

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            # Counting costs a list of pointers, a small fraction of the full collection just done.
            old = len(gc.get_objects(generation=2))
            gc.set_threshold(self.young, max(self.floor, int(old * self.share) // self.young), 1)


@contextmanager
def collector(config: GCConfig) -> Iterator[None]:
    """Apply `config` for the duration of the block; restores the previous settings after.

    The collector is process-wide: one runner per process (nested blocks restore in order;
    blocks that end out of order, e.g. two concurrent runners, leave the outer's settings)."""
    before = gc.get_threshold()
    if config.profile == "cpython" or before[0] == 0:  # 0: automatic collection was switched off; keep it so
        yield
        return
    callback = None
    gc.freeze()
    if config.profile == "throughput":
        gc.set_threshold(before[0], config.middle_every, before[2])
    else:
        callback = _ScaledMiddle(before[0], before[1], config.middle_share)
        gc.set_threshold(before[0], before[1], 1)
        gc.callbacks.append(callback)
    try:
        yield
    finally:
        if callback is not None:
            gc.callbacks.remove(callback)
        gc.set_threshold(*before)
        gc.unfreeze()
