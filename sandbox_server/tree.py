"""Walking and removing directory trees of any depth: no recursion, a bounded number of open descriptors.

A slot can make a tree thousands of directories deep with `mkdir x; cd x` in a loop. Recursive
walks (os.fwalk, shutil.rmtree before CPython 3.13) then raise RecursionError, and even an
iterative walk that keeps one descriptor per level runs out of them. Here every walk works from
directory descriptors (never a path string, which would pass PATH_MAX), never follows a link, and
holds at most one descriptor per level it enters: `walk` does not enter directories past
`max_depth` (it names them instead), and `remove_tree` moves a subtree it reaches at its
descriptor bound up to the top of the tree being removed, where it is taken apart later.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator
from dataclasses import dataclass, field

__all__ = ["DEFAULT_MAX_DEPTH", "Dir", "remove_tree", "remove_tree_quietly", "walk"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
log = logging.getLogger("sandbox_server.tree")
# Directories a workspace path may nest by default (SlotLimits.max_path_depth); real projects stay far below.
DEFAULT_MAX_DEPTH = 128
# Descriptors remove_tree holds at once; deeper subtrees are moved up instead of entered.
REMOVE_OPEN_MAX = 64


@dataclass
class Dir:
    """One directory as `walk` visits it; prune `dirs` in place to skip subdirectories."""

    rel: str  # path below the walk's top ("" for the top itself)
    fd: int  # open until the walk moves past this directory's subtree
    depth: int  # directories between the top and this one (0 for the top)
    dirs: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # everything that is not a directory (links included)


def _entries(fd: int, limit: int | None = None) -> tuple[list[str], list[str]]:
    dirs: list[str] = []
    files: list[str] = []
    with os.scandir(fd) as it:
        for n, entry in enumerate(it):
            if limit is not None and n >= limit:
                break
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
    return dirs, files


def walk(
    top: str,
    *,
    max_depth: int,
    dir_fd: int | None = None,
    too_deep: list[str] | None = None,
    max_listed: int | None = None,
) -> Generator[Dir, None, None]:
    """Every directory under `top` (itself first), depth first, never following links.

    Directories deeper than `max_depth` are not entered; their paths go to `too_deep`. A
    directory that vanishes or cannot be opened meanwhile is skipped. `max_listed`: at most that
    many names of each directory are listed (a caller that stops there need not read a huge one).
    """
    fd = os.open(top, DIR_FLAGS, dir_fd=dir_fd)
    stack: list[tuple[Dir, list[str]]] = []  # directories entered, each with the subdirectories still to visit
    try:
        current: Dir | None = Dir("", fd, 0)
        while current is not None:
            try:
                current.dirs, current.files = _entries(current.fd, max_listed)
            except OSError:
                current.dirs, current.files = [], []
            todo: list[str] = []
            stack.append((current, todo))
            yield current
            todo.extend(reversed(current.dirs))
            current = None
            while stack and current is None:
                parent, todo = stack[-1]
                if not todo:
                    os.close(parent.fd)
                    stack.pop()
                    continue
                name = todo.pop()
                rel = f"{parent.rel}/{name}" if parent.rel else name
                if parent.depth + 1 > max_depth:
                    if too_deep is not None:
                        too_deep.append(rel)
                    continue
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=parent.fd)
                except OSError:
                    continue
                current = Dir(rel, child, parent.depth + 1)
    finally:
        for d, _ in stack:
            os.close(d.fd)


def remove_tree(path: str | os.PathLike[str], *, dir_fd: int | None = None, open_max: int = REMOVE_OPEN_MAX) -> int:
    """Remove `path` (a name in `dir_fd` if given) and everything below it, whatever its depth; returns how many entries went.

    A link is removed, never followed. Raises OSError for what cannot be removed (a mount point, a
    file the caller may not delete); a missing `path` is not an error.
    """
    if dir_fd is None:
        parent, name = os.path.split(os.path.abspath(path))
        pfd = os.open(parent, DIR_FLAGS)
    else:
        name, pfd = os.fspath(path), os.dup(dir_fd)
    removed = 0
    stack: list[tuple[int, str, list[str]]] = []  # (fd, name in its parent, subdirectories still to remove)
    try:
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            if exc.errno not in (20, 40):  # ENOTDIR, ELOOP (a symbolic link): a single entry
                raise
            os.unlink(name, dir_fd=pfd)
            return 1
        moved = 0
        while True:
            dirs: list[str] = []
            stack.append((fd, name, dirs))  # first: closed by the finally whatever fails below
            subdirs, files = _entries(fd)
            dirs.extend(subdirs)
            for f in files:
                try:
                    os.unlink(f, dir_fd=fd)
                except FileNotFoundError:  # gone meanwhile (a process still exiting): what we wanted
                    continue
                removed += 1
            fd = -1
            while stack and fd == -1:
                cur, cur_name, todo = stack[-1]
                if not todo:
                    os.close(cur)
                    stack.pop()
                    os.rmdir(cur_name, dir_fd=stack[-1][0] if stack else pfd)
                    removed += 1
                    continue
                sub = todo.pop()
                if len(stack) >= open_max:
                    # Out of descriptors for this depth: hang the subtree under the top, emptied from there.
                    top, _, top_todo = stack[0]
                    while True:
                        moved += 1
                        new = f".removing-{moved}"
                        try:
                            os.stat(new, dir_fd=top, follow_symlinks=False)
                        except FileNotFoundError:
                            break
                    os.rename(sub, new, src_dir_fd=cur, dst_dir_fd=top)
                    top_todo.append(new)
                    continue
                try:
                    fd, name = os.open(sub, DIR_FLAGS, dir_fd=cur), sub
                except FileNotFoundError:
                    fd = -1
            if not stack:
                return removed
    finally:
        for d, _, _ in stack:
            os.close(d)
        os.close(pfd)


def remove_tree_quietly(path: str | os.PathLike[str]) -> None:
    """`remove_tree` for clean-ups that must not fail their caller: what cannot be removed is logged and left."""
    try:
        remove_tree(path)
    except OSError as exc:
        log.warning("could not remove all of %s: %s", path, exc)
