"""One timer per trajectory for the agent loop's two limits (the model call's timeout, the budget).

`asyncio.timeout` per step cost a Timeout, a TimerHandle, a heap push and a cancelled handle left
in the loop's heap for every model call and every tool step: at 10,000 concurrent trajectories,
a quarter of the loop's time (bench/loop.py). A `Watchdog` keeps one timer and moves a due time:
`arm(when)` only sets a float while the pending timer fires no later than `when`; a timer that
fires before the current due time (the step moved on to a later one) sets itself again for it.
A trajectory therefore makes a handful of timers, not two per turn.

On expiry it cancels the task, as `asyncio.timeout` does, and `expired()` tells the loop's
`except CancelledError` whether the cancellation was its own (then it is taken back with
`uncancel`, so the caller's task carries on undisturbed) or came from outside (re-raised).
"""

from __future__ import annotations

import asyncio
from math import inf

__all__ = ["Watchdog"]


class Watchdog:
    """Cancels its task once the time set by the last `arm` has passed; `close` when done."""

    __slots__ = ("_loop", "_task", "_cancelling", "_handle", "_at", "_due", "_fired")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a Watchdog guards a task; create it inside one")
        self._task = task
        self._cancelling = task.cancelling()  # cancels already requested are not ours to take back
        self._handle: asyncio.TimerHandle | None = None
        self._at = inf  # when the pending timer fires
        self._due = inf
        self._fired = False

    def arm(self, due: float) -> None:
        """The current step must end by `due` (loop time); replaces the previous step's limit."""
        if self._fired:  # the last step finished although its time ran out (it swallowed the cancel)
            self._settle()
        self._due = due
        if due < self._at:  # the pending timer would fire too late: the only case that makes a new one
            if self._handle is not None:
                self._handle.cancel()
            self._at = due
            self._handle = self._loop.call_at(due, self)

    def __call__(self) -> None:
        """The timer's callback (the watchdog itself: no bound method kept per trajectory)."""
        if self._due > self._at:  # the step it was set for is over; a later one runs until _due
            self._at = self._due
            self._handle = self._loop.call_at(self._due, self)
            return
        self._handle, self._at = None, inf
        self._fired = True
        self._task.cancel()

    def expired(self) -> bool:
        """Called where CancelledError arrives: True (and the cancel taken back) when it was the
        watchdog's own; False for a cancel from outside, which must propagate."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() <= self._cancelling

    def _settle(self) -> None:
        # A step that finished without CancelledError although it timed out keeps its result, and
        # the cancel is taken back, as `asyncio.timeout` does (here at the next arm or close).
        self._fired = False
        self._task.uncancel()

    def close(self) -> None:
        if self._fired:
            self._settle()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._at = inf
