"""What a slot's workspace holds, and trimming it back under its quota (sandbox_server/quota.py decides when).

Walks are iterative, never follow links, and enter at most `max_path_depth` directories deep
(sandbox_server/tree.py); hard links count once.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
from dataclasses import dataclass, field

from sandbox_server.tree import remove_tree, walk

__all__ = ["Usage", "disk_usage", "fs_used", "measure", "prune_deep", "trim_bytes", "trim_files"]


@dataclass
class Usage:
    """What a workspace holds: allocated bytes, entries (inodes), and directories past the depth limit."""

    bytes: int = 0
    files: int = 0
    too_deep: list[str] = field(default_factory=list)
    entries: int = 0  # names visited, each hard link too


def disk_usage(
    root: str,
    max_depth: int,
    stop_above: int | None = None,
    stop_files: int | None = None,
    stop_entries: int | None = None,
) -> Usage:
    """Bytes allocated under `root` (st_blocks) and its entries (hard links once, links not followed).

    Directories deeper than `max_depth` are not entered but named in `too_deep`. The walk stops
    early past `stop_above` bytes or `stop_files` entries, or past `stop_entries` names visited (hard
    links too: they make no new entries, so only this bounds the walk's own work).
    """
    seen: set[tuple[int, int]] = set()
    usage = Usage()
    max_bytes = math.inf if stop_above is None else stop_above
    max_files = math.inf if stop_files is None else stop_files
    max_entries = math.inf if stop_entries is None else stop_entries
    try:
        usage.bytes = os.lstat(root).st_blocks * 512
        listed = None if stop_entries is None else stop_entries + 1
        walker = walk(root, max_depth=max_depth, too_deep=usage.too_deep, max_listed=listed)
        for d in walker:
            for name in d.dirs + d.files:
                usage.entries += 1
                if usage.entries > max_entries:
                    walker.close()
                    return usage
                try:
                    st = os.lstat(name, dir_fd=d.fd)
                except OSError:
                    continue
                if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                usage.bytes += st.st_blocks * 512
                usage.files += 1
                if usage.files > max_files or usage.bytes > max_bytes:  # per entry: one huge directory stops too
                    walker.close()
                    return usage
    except OSError:
        pass
    return usage


def measure(root: str, max_depth: int, stop_above: int, stop_files: int) -> tuple[tuple[int, int], Usage]:
    """The filesystem's counters, then the workspace's usage: one hand-off to a thread for both."""
    return fs_used(root), disk_usage(root, max_depth, stop_above, stop_files)


def fs_used(root: str) -> tuple[int, int]:
    """The filesystem's used bytes and used inodes."""
    try:
        st = os.statvfs(root)
    except OSError:
        return 0, 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree


def prune_deep(root: str, max_depth: int) -> list[str]:
    """Remove every directory nested deeper than `max_depth` (whole); returns their paths."""
    removed = []
    for d in walk(root, max_depth=max_depth):
        if d.depth == max_depth:
            for name in d.dirs:
                with contextlib.suppress(OSError):
                    remove_tree(name, dir_fd=d.fd)
                    removed.append(f"{d.rel}/{name}" if d.rel else name)
            d.dirs.clear()
    return removed


def trim_bytes(root: str, quota: int, max_depth: int, since: float) -> list[tuple[str, int]]:
    """Remove files until the workspace is under `quota`: written since `since` first, largest first. Never follows links.

    A file's every name goes (hard links included: the slot cannot link outside its filesystem tree).
    """
    usage = disk_usage(root, max_depth).bytes  # in full: the check's walk may have stopped early
    inodes: dict[tuple[int, int], tuple[bool, int, list[str]]] = {}
    for d in walk(root, max_depth=max_depth):
        for name in d.files:
            with contextlib.suppress(OSError):
                st = os.lstat(name, dir_fd=d.fd)
                if stat.S_ISREG(st.st_mode) and st.st_blocks:
                    key = (st.st_dev, st.st_ino)
                    entry = inodes.setdefault(key, (st.st_mtime >= since, st.st_blocks * 512, []))
                    entry[2].append(f"{d.rel}/{name}" if d.rel else name)
    chosen: dict[str, int] = {}
    for _recent, size, paths in sorted(inodes.values(), key=lambda f: (not f[0], -f[1])):
        if usage <= quota:
            break
        chosen.update(dict.fromkeys(paths, size))
        usage -= size
    removed = []
    for d in walk(root, max_depth=max_depth):
        for name in d.files:
            path = f"{d.rel}/{name}" if d.rel else name
            if path in chosen:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=d.fd)
                    removed.append((path, chosen[path]))
    return removed


def trim_files(root: str, limit: int, max_depth: int, since: float) -> int:
    """Remove entries made since `since` until the workspace holds at most `limit`: files newest first, then directories."""
    excess = disk_usage(root, max_depth).files - limit
    if excess <= 0:
        return 0
    recent: list[tuple[float, str]] = []
    for d in walk(root, max_depth=max_depth):
        for name in d.files:
            with contextlib.suppress(OSError):
                st = os.lstat(name, dir_fd=d.fd)
                if st.st_mtime >= since:
                    recent.append((st.st_mtime, f"{d.rel}/{name}" if d.rel else name))
    chosen = {path for _, path in sorted(recent, reverse=True)[:excess]}
    removed = 0
    for d in walk(root, max_depth=max_depth):
        for name in d.files:
            if (f"{d.rel}/{name}" if d.rel else name) in chosen:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=d.fd)
                    removed += 1
    excess -= removed
    if excess > 0:  # directories: whole subtrees made since `since`, until under the limit
        for d in walk(root, max_depth=max_depth):
            for name in list(d.dirs):
                if excess <= 0:
                    break
                with contextlib.suppress(OSError):
                    if os.lstat(name, dir_fd=d.fd).st_mtime >= since:
                        gone = remove_tree(name, dir_fd=d.fd)
                        d.dirs.remove(name)
                        excess -= gone
                        removed += gone
            if excess <= 0:
                break
    return removed
