"""Whether the machine was idle while a bench ran: printed beside its ratios.

Ratios against a baseline in the same run hold up under load better than absolute figures, but
not perfectly (a loaded machine stretches some baselines more than others), so every bench says
which kind of figure it printed.
"""

from __future__ import annotations

import os


def load_note() -> str:
    """One line: the 1-minute load average against the cores, and the verdict idle or loaded."""
    one, five, _ = os.getloadavg()
    cores = os.cpu_count() or 1
    verdict = "idle" if one < 1.0 else f"LOADED ({one / cores:.1f} runnable per core)"
    return f"machine: load {one:.1f} (5 min {five:.1f}) on {cores} cores: {verdict}"
