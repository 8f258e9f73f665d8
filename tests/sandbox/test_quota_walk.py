"""The workspace walk behind a slot's disk quota (sandbox_server/quota.py), on real directories.

A slot's walk after a command runs on the event loop when the workspace held a handful of entries and
the filesystem gained no more inodes than that; it must stay exact when that screen is fooled (others'
deletions offsetting the slot's growth), and a walk with a stop must stop inside one huge directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_server.isolation import SlotLimits
from sandbox_server.quota import INLINE_WALK_ENTRIES, LimitExceeded, SlotGuard, disk_usage


def test_a_walk_with_a_stop_stops_inside_one_large_directory(tmp_path: Path) -> None:
    for i in range(1000):
        (tmp_path / f"f{i}").touch()
    assert disk_usage(str(tmp_path), 64).files == 1000
    assert disk_usage(str(tmp_path), 64, stop_files=10).files == 11


async def test_growth_hidden_by_deletions_elsewhere_is_still_counted(tmp_path: Path) -> None:
    """The slot makes more entries than the inline walk takes while as many are deleted beside it on the
    same filesystem: the filesystem's inode count does not move, and the slot is still over its limit."""
    workspace, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    workspace.mkdir()
    elsewhere.mkdir()
    made = INLINE_WALK_ENTRIES * 3
    for i in range(made):
        (elsewhere / f"e{i}").touch()
    limits = SlotLimits(workspace_files=INLINE_WALK_ENTRIES * 2, watchdog_interval_s=60)
    killed: list[int] = []
    guard = SlotGuard(limits, killed.append)
    guard.add("s0", str(workspace), uid=os.getuid())
    guard.start()
    try:
        with pytest.raises(LimitExceeded) as breach:
            async with guard.command("s0"):
                for i in range(made):
                    (workspace / f"w{i}").touch()
                    (elsewhere / f"e{i}").unlink()
        assert f"{made} files, over its limit of {INLINE_WALK_ENTRIES * 2} files" in str(breach.value)
        assert killed == [os.getuid()]
        assert len(os.listdir(workspace)) <= INLINE_WALK_ENTRIES * 2  # the newest entries went
    finally:
        await guard.stop()


def test_a_walk_with_an_entry_stop_stops_inside_a_directory_of_hard_links(tmp_path: Path) -> None:
    """The walk after a command runs on the event loop for a workspace of a handful of files; hard links make no
    new files (each file is counted once), so a stop on files never came: 300k links (8 MB) held the server's
    event loop ~0.8 s after every command. The inline walk stops on the names it visits."""
    (tmp_path / "target").touch()
    links = tmp_path / "links"
    links.mkdir()
    for i in range(2000):
        os.link(tmp_path / "target", links / f"l{i}")
    full = disk_usage(str(tmp_path), 64)
    assert (full.files, full.entries) == (2, 2002)
    stopped = disk_usage(str(tmp_path), 64, stop_entries=INLINE_WALK_ENTRIES)
    assert stopped.entries == INLINE_WALK_ENTRIES + 1
