"""The starting tree of each SWE-smith instance, built on this machine: a bare mirror per repository (never
visible to slots) and a one-commit snapshot bundle per instance (its history would reveal the bug), with
the test files the verifier restores."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from environments.swe_smith.instances import SweSmithInstance
from environments.swe_smith.mirror import REMOVE_TESTS_COMMIT, git_async, git_ok

__all__ = ["SnapshotStore", "Start"]


@dataclass(frozen=True)
class Start:
    bundle: Path  # one commit holding the starting tree
    commit: str  # that commit
    tests: Path | None  # tar of the test files the verifier restores (None: nothing to restore)
    restored: tuple[str, ...]  # their paths


class SnapshotStore:
    """Bare mirrors and snapshot bundles under `cache`, each built once (a lock per mirror and per instance)."""

    def __init__(self, cache: Path, setup_timeout_s: float) -> None:
        self._cache = cache
        self._setup_timeout_s = setup_timeout_s  # cloning and fetching a mirror
        self._snapshots: dict[str, Start] = {}
        self._locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)

    async def mirror(self, item: SweSmithInstance, mirror_base: str) -> Path:
        """This machine's bare clone of the instance's mirror, holding its task branch."""
        source = item.source(mirror_base)
        bare = self._cache / "mirrors" / (hashlib.sha1(source.encode()).hexdigest()[:12] + "-" + item.name + ".git")
        async with self._locks[str(bare)]:
            if not bare.exists():
                tmp = bare.with_name(bare.name + f".tmp{os.getpid()}")
                await git_async(["clone", "-q", "--mirror", source, str(tmp)], self._setup_timeout_s)
                tmp.rename(bare)
            wanted = [f"refs/heads/{item.instance_id}", *([item.base_commit] if item.base_commit else [])]
            if not [ref for ref in wanted if await git_ok(["-C", str(bare), "cat-file", "-e", f"{ref}^{{commit}}"])]:
                await git_async(
                    ["-C", str(bare), "fetch", "-q", "origin", "+refs/heads/*:refs/heads/*"],
                    self._setup_timeout_s,
                )
        return bare

    async def snapshot(self, item: SweSmithInstance, mirror_base: str) -> Start:
        """The instance's starting tree as a one-commit bundle, and the test files the verifier restores.

        The start is the task branch's head (the row's `base_commit` if the mirror has no such branch).
        On SWE-smith's published layout that head is "Remove F2P Tests": the agent never sees the
        FAIL_TO_PASS test files, and the verifier takes them (with every other test file the row names)
        from the "Bug Patch" commit below it, as SWE-smith's harness does with `HEAD~1`.
        """
        async with self._locks[item.instance_id]:
            if item.instance_id in self._snapshots:
                return self._snapshots[item.instance_id]
            bare = await self.mirror(item, mirror_base)
            git = ["-C", str(bare)]
            branch = f"refs/heads/{item.instance_id}"
            if await git_ok([*git, "cat-file", "-e", f"{branch}^{{commit}}"]):
                head = await git_async([*git, "rev-parse", branch], 60)
            elif item.base_commit and await git_ok([*git, "cat-file", "-e", f"{item.base_commit}^{{commit}}"]):
                head = item.base_commit
            else:
                raise RuntimeError(
                    f"{item.source(mirror_base)} has neither a branch {item.instance_id} nor the row's "
                    f"base_commit {item.base_commit}; check --env.mirror_base or the row's repo"
                )
            tests_from, hidden = head, []
            if await git_async([*git, "log", "-1", "--format=%s", head], 60) == REMOVE_TESTS_COMMIT:
                tests_from = await git_async([*git, "rev-parse", f"{head}^"], 60)
                deleted = await git_async([*git, "diff", "--name-only", "--diff-filter=D", tests_from, head], 60)
                hidden = deleted.splitlines()
            tracked = set((await git_async([*git, "ls-tree", "-r", "--name-only", tests_from], 120)).splitlines())
            restore = sorted(set(hidden) | (set(item.test_files) & tracked))
            tree = await git_async([*git, "rev-parse", f"{head}^{{tree}}"], 60)
            snap = await git_async([*git, "commit-tree", tree, "-m", f"{item.instance_id}"], 60)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", item.instance_id)
            await git_async([*git, "update-ref", f"refs/hermes/{safe}", snap], 60)
            bundle = self._cache / "bundles" / f"{safe}-{snap[:12]}.bundle"
            bundle.parent.mkdir(parents=True, exist_ok=True)
            if not bundle.exists():
                partial = bundle.with_suffix(f".tmp{os.getpid()}")
                await git_async([*git, "bundle", "create", "-q", str(partial), f"refs/hermes/{safe}"], 300)
                partial.replace(bundle)
            tests: Path | None = None
            if restore:
                tests = bundle.with_name(f"{safe}-{tests_from[:12]}.tests.tar")
                if not tests.exists():
                    partial = tests.with_suffix(f".tmp{os.getpid()}")
                    await git_async(
                        [*git, "archive", "--format=tar", "-o", str(partial), tests_from, "--", *restore], 300
                    )
                    partial.replace(tests)
            start = Start(bundle, snap, tests, tuple(restore))
            self._snapshots[item.instance_id] = start
            return start
