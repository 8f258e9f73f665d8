"""A slot's totals that rlimits cannot express: all its memory together, and its workspace disk.

Each slot's commands run as a uid of their own, so a watchdog finds them without cgroups
(Modal, Nomad, cgroup v1 without systemd): every `watchdog_interval_s` it scans /proc for
processes whose uid is a slot's (the owner of /proc/<pid>: since Linux 4.11 the effective uid
even for a non-dumpable process), sums their resident memory (RSS as a cheap screen; PSS, which
splits shared pages fairly, to confirm) plus what the slot's /tmp tmpfs holds, and over
`slot_memory_bytes` kills every process of that uid.

Disk: a slot's usage is the allocated blocks of everything in its workspace (hard links once),
and its entries (inodes: files, directories, links). Walks are iterative and enter at most
`max_path_depth` directories deep (sandbox_server/tree.py); deeper directories are a breach.
After a command (each watchdog tick while the slot has processes, and when a command ends) the
workspace is walked whenever its last walk was cheap (under CHEAP_WALK_S: a SWE-sized repository,
so small workspaces are always exact). A larger one is walked only if the filesystem as a whole grew
by more than the slot's room (bytes or inodes) since its last walk, or shrank (space freed elsewhere,
by other slots, containers or image layers, would hide the slot's growth), or that walk is over
MAX_WALK_AGE_S old (or 20x its own duration). The gap, stated, for large workspaces only: frees
elsewhere offset by others' growth meanwhile can still hide a slot's growth until that age; so can
a file deleted while a command keeps it open (until the command ends; RLIMIT_FSIZE bounds each). write_file is exact: it walks when a command ran
since the last walk or the write might not fit, and refuses before writing. Over
`workspace_bytes` the slot's processes are killed and the largest files written since the
command began are removed until the workspace is under quota again; the call fails naming them.
Over `workspace_files`, the newest entries the command made go the same way; directories
nested past `max_path_depth` are removed whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sandbox_server.fileops import QuotaExceeded
from sandbox_server.isolation import SlotLimits
from sandbox_server.workspace_usage import Usage, disk_usage, fs_used, measure, prune_deep, trim_bytes, trim_files

__all__ = ["LimitExceeded", "SlotGuard", "Usage", "disk_usage"]

log = logging.getLogger("sandbox_server.quota")
MiB = 1024 * 1024
# Even when the filesystem did not grow, rewalk an active slot this often: space another slot or
# process freed meanwhile can hide a slot's growth from the filesystem-wide figure.
MAX_WALK_AGE_S = 10.0
# A workspace whose last walk took less than this is walked after every command: exact, and cheap
# (a 4k-entry repository walks in ~20 ms here), so the filesystem-wide screen below is for large ones.
CHEAP_WALK_S = 0.025
# A workspace that had at most this many entries, on a filesystem that gained no more inodes than
# that since, is walked on the event loop (tens of microseconds) instead of on a thread.
INLINE_WALK_ENTRIES = 64
_PAGE = os.sysconf("SC_PAGE_SIZE")


class LimitExceeded(Exception):
    """A slot went over a total; `kind` is the API's error kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class _Slot:
    id: str
    root: str
    uid: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    disk: int = 0  # bytes at the last walk
    files: int = 0  # entries at the last walk
    too_deep: bool = False  # the last walk found directories past the depth limit
    fs_used: tuple[int, int] = (0, 0)  # the filesystem's used bytes and inodes at that walk
    walked_at: float = 0.0
    walk_s: float = 0.0  # how long the last walk took
    dirty: bool = False  # something may have written since the last walk
    running: int = 0  # commands under way
    since: float = 0.0  # wall-clock start of the current command (files newer than this are its own)
    generation: int = 0  # bumped by reset: a walk that began before it is stale
    breach: LimitExceeded | None = None


@dataclass(frozen=True)
class _Sample:
    rss: int
    pids: dict[int, int]  # pid -> its RSS
    tmp: int


class SlotGuard:
    """The watchdog and disk quota of one server's slots; hooks: add, start, command, room, wrote, reset, stop."""

    def __init__(self, limits: SlotLimits, kill_uid: Callable[[int], None]) -> None:
        self.limits = limits
        self._kill_uid = kill_uid
        self._slots: dict[str, _Slot] = {}
        self._by_uid: dict[int, _Slot] = {}
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="slot-guard")
        self._task: asyncio.Task | None = None
        self._own_mnt = os.stat("/proc/self/ns/mnt").st_ino
        self.enabled = False

    def add(self, slot_id: str, root: str, uid: int) -> None:
        s = _Slot(slot_id, root, uid, walked_at=time.monotonic(), fs_used=fs_used(root))
        self._slots[slot_id] = s
        self._by_uid[uid] = s

    def start(self) -> None:
        """Enforce from now on (only with isolation: the slots' processes are found by their uid)."""
        self.enabled = True
        self._task = asyncio.create_task(self._watch(), name="slot-guard")

    async def stop(self) -> None:
        self.enabled = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pool.shutdown(wait=False, cancel_futures=True)

    def describe(self) -> dict:
        lim = self.limits
        if not self.enabled:
            return {
                "slot_memory_bytes": None,
                "workspace_bytes": None,
                "workspace_files": None,
                "max_path_depth": None,
                "watchdog": None,
            }
        return {
            "slot_memory_bytes": {
                "value": lim.slot_memory_bytes,
                "how": "watchdog: resident memory (RSS screen, PSS to confirm) of the slot uid's processes plus its "
                "/tmp; over it every process of the uid is killed and the call fails (kind memory_limit)",
            },
            "workspace_files": {
                "value": lim.workspace_files,
                "how": "entries (inodes) under the workspace, checked with its disk; over it the newest entries the "
                "command made are removed and the call fails (kind quota_exceeded)",
            },
            "max_path_depth": {
                "value": lim.max_path_depth,
                "how": "file tools refuse deeper paths; walks stop there and deeper directories are removed whole "
                "(kind quota_exceeded)",
            },
            "workspace_bytes": {
                "value": lim.workspace_bytes,
                "how": "allocated blocks under the workspace, checked each tick while the slot runs, when a command "
                "ends and before write_file (walked only when the filesystem grew by more than the slot's room, or "
                f"every {MAX_WALK_AGE_S:.0f} s); over it the slot's processes are killed, the largest files the command "
                "wrote are removed and the call fails (kind quota_exceeded)",
            },
            "watchdog": {
                "interval_s": lim.watchdog_interval_s,
                "running": self._task is not None and not self._task.done(),
                "mechanism": "/proc scan by slot uid; no cgroups needed",
            },
        }

    # -- hooks -------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def command(self, slot_id: str) -> AsyncIterator[None]:
        """Around one command: afterwards check the disk, then raise what the slot went over meanwhile (LimitExceeded)."""
        s = self._slots[slot_id]
        s.running += 1
        s.dirty = True
        s.since = time.time() - 1.0  # mtime granularity: a second of slack
        s.breach = None  # one the watchdog found as the previous command ended is not this command's
        try:
            yield
        finally:
            s.running -= 1
        if not self.enabled:
            return
        async with s.lock:
            await self._check_disk(s)
            breach, s.breach = s.breach, None
        if breach is not None:
            raise breach

    async def room(self, slot_id: str, size: int) -> tuple[int, int] | None:
        """Bytes and entries write_file may add to the workspace; None: no quota. Exact whenever the write might not fit."""
        s = self._slots[slot_id]
        if not self.enabled:
            return None
        lim = self.limits
        async with s.lock:
            if s.dirty or s.disk + size > lim.workspace_bytes or s.files + lim.max_path_depth > lim.workspace_files:
                await self._walk(s)
            return lim.workspace_bytes - s.disk, lim.workspace_files - s.files

    def wrote(self, slot_id: str, size: int, entries: int) -> None:
        """write_file wrote `size` bytes and made `entries` new entries (an overwrite only makes the next check walk sooner)."""
        s = self._slots[slot_id]
        s.disk += size
        s.files += entries

    def reset(self, slot_id: str) -> None:
        """The slot got an empty workspace."""
        s = self._slots[slot_id]
        s.generation += 1
        s.disk, s.files, s.too_deep, s.breach = 0, 0, False, None
        s.fs_used, s.walked_at, s.dirty = fs_used(s.root), time.monotonic(), False

    # -- disk --------------------------------------------------------------------------------
    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _over(self, s: _Slot) -> bool:
        return s.disk > self.limits.workspace_bytes or s.files > self.limits.workspace_files or s.too_deep

    async def _refresh(self, s: _Slot) -> None:
        """Walk the workspace if the slot may have gone over quota since its last walk (see the module docstring)."""
        if not s.dirty:
            return
        # statvfs reads the filesystem's counters (no I/O on a local disk): inline, not a thread
        # hand-off, which would add a wake-up to the end of every command.
        used, inodes = fs_used(s.root)
        grown, made = used - s.fs_used[0], inodes - s.fs_used[1]
        # Shrunk: something freed space meanwhile, which may offset this slot's growth in the totals.
        shrunk = grown < 0 or made < 0
        stale = time.monotonic() - s.walked_at > max(MAX_WALK_AGE_S, 20 * s.walk_s)
        lim = self.limits
        if not shrunk and s.files + made <= INLINE_WALK_ENTRIES:
            # A handful of entries: walking them here costs less than the hand-off to a thread. A walk
            # that finds more (others' deletions offset this slot's growth) stops and goes to the thread.
            started = time.monotonic()
            usage = disk_usage(s.root, lim.max_path_depth, stop_entries=INLINE_WALK_ENTRIES)
            if usage.entries <= INLINE_WALK_ENTRIES:
                self._walked(s, s.generation, started, (used, inodes), usage)
                return
            await self._walk(s)
        elif (
            s.walk_s < CHEAP_WALK_S
            or shrunk
            or stale
            or s.disk + grown > lim.workspace_bytes
            or s.files + made > lim.workspace_files
        ):
            await self._walk(s)

    async def _walk(self, s: _Slot) -> None:
        lim = self.limits
        generation, started = s.generation, time.monotonic()
        fs_before, usage = await self._run(
            measure, s.root, lim.max_path_depth, 2 * lim.workspace_bytes, 2 * lim.workspace_files
        )
        self._walked(s, generation, started, fs_before, usage)

    @staticmethod
    def _walked(s: _Slot, generation: int, started: float, fs_before: tuple[int, int], usage: Usage) -> None:
        if generation == s.generation:  # not reset meanwhile
            s.disk, s.files, s.too_deep = usage.bytes, usage.files, bool(usage.too_deep)
            s.fs_used, s.walked_at, s.walk_s = fs_before, started, time.monotonic() - started
            s.dirty = s.running > 0

    async def _check_disk(self, s: _Slot) -> None:
        lim = self.limits
        await self._refresh(s)
        if not self._over(s):
            return
        used, files, too_deep, generation = s.disk, s.files, s.too_deep, s.generation
        await self._run(self._kill_uid, s.uid)
        try:
            # always: a walk that stopped early (past twice the quota) may not have reached the deep part
            pruned = await self._run(prune_deep, s.root, lim.max_path_depth)
            removed = await self._run(trim_bytes, s.root, lim.workspace_bytes, lim.max_path_depth, s.since)
            unlinked = await self._run(trim_files, s.root, lim.workspace_files, lim.max_path_depth, s.since)
        except OSError as exc:  # e.g. the workspace itself went away: report the breach all the same
            log.warning("slot %s: trimming its workspace failed: %s", s.id, exc)
            pruned, removed, unlinked = [], [], 0
        await self._walk(s)
        if generation != s.generation:
            return  # reset meanwhile: nothing to report to the next trajectory
        quota, limit, depth = lim.workspace_bytes, lim.workspace_files, lim.max_path_depth
        what, done = [], []
        if used > quota:
            names = ", ".join(f"{p} ({size // MiB} MiB)" for p, size in removed[:5]) or "none"
            more = f" and {len(removed) - 5} more" if len(removed) > 5 else ""
            what.append(
                f"{'over ' if used > 2 * quota else ''}{used // MiB} MiB, over its disk quota of {quota // MiB} MiB"
            )
            done.append(f"the largest files written by this command were removed ({names}{more})")
        if files > limit:
            what.append(f"{'over ' if files > 2 * limit else ''}{files} files, over its limit of {limit} files")
            done.append(f"{unlinked} entries this command made were removed")
        if too_deep or pruned:
            what.append(f"directories nested over {depth} levels deep")
            done.append(f"the directories below that depth were removed ({', '.join(p[-60:] for p in pruned[:3])})")
        s.breach = LimitExceeded(
            QuotaExceeded.kind,
            f"the workspace held {' and '.join(what)}: the slot's commands were stopped and {'; '.join(done)}; now "
            f"{s.disk // MiB} MiB in {s.files} files. Write less, keep trees shallower, or delete files you no longer need.",
        )

    # -- memory ------------------------------------------------------------------------------
    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.limits.watchdog_interval_s)
            try:
                await self._tick()
            except Exception:  # noqa: BLE001 - a failed tick must not end enforcement for the server's life
                log.exception("slot watchdog tick failed; trying again next interval")

    async def _tick(self) -> None:
        samples = await self._run(self._scan)
        active = [self._by_uid[uid] for uid in samples]
        for s in active:
            s.dirty = True
            sample = samples[s.uid]
            if sample.rss + sample.tmp > self.limits.slot_memory_bytes:
                await self._check_memory(s, sample)
        # memory first for every slot: a slow walk of one slot's tree must not delay another's kill

        async def disk(s: _Slot) -> None:
            async with s.lock:
                await self._check_disk(s)

        # a slot with a huge tree is walked from here at most a fifth of the time
        due = [s for s in active if not s.lock.locked() and time.monotonic() - s.walked_at > 5 * s.walk_s]
        await asyncio.gather(*(disk(s) for s in due))

    def _scan(self) -> dict[int, _Sample]:
        """RSS, pids and /tmp usage of every slot uid that has processes now."""
        rss: dict[int, int] = {}
        pids: dict[int, dict[int, int]] = {}
        tmp: dict[int, dict[int, int]] = {}  # uid -> mount namespace -> bytes used in its /tmp
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                # /proc/<pid> itself always shows the effective uid, even for a process that made itself
                # non-dumpable (its files then show root's); a slot's processes cannot change theirs.
                owner = entry.stat().st_uid
                if owner not in self._by_uid:
                    continue
                with open(f"/proc/{entry.name}/statm", "rb") as fh:
                    resident = int(fh.read().split()[1]) * _PAGE
                mnt = os.stat(f"/proc/{entry.name}/ns/mnt").st_ino
                if mnt != self._own_mnt and mnt not in tmp.setdefault(owner, {}):  # the host's /tmp is not the slot's
                    st = os.statvfs(f"/proc/{entry.name}/root/tmp")
                    tmp[owner][mnt] = (st.f_blocks - st.f_bfree) * st.f_frsize
            except (OSError, ValueError):
                continue  # gone meanwhile
            rss[owner] = rss.get(owner, 0) + resident
            pids.setdefault(owner, {})[int(entry.name)] = resident
        return {uid: _Sample(rss[uid], pids[uid], sum(tmp.get(uid, {}).values())) for uid in rss}

    @staticmethod
    def _pss(pids: dict[int, int]) -> int:
        """Sum of PSS; a process whose smaps_rollup cannot be read (older kernels, gVisor) counts with its RSS."""
        total = 0
        for pid, rss in pids.items():
            try:
                with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                    line = next(ln for ln in fh if ln.startswith(b"Pss:"))
                total += int(line.split()[1]) * 1024
            except (FileNotFoundError, ProcessLookupError):
                continue  # ended since the scan
            except (OSError, ValueError, StopIteration):
                total += rss
        return total

    async def _check_memory(self, s: _Slot, sample: _Sample) -> None:
        limit = self.limits.slot_memory_bytes
        used = await self._run(self._pss, sample.pids) + sample.tmp
        if used <= limit:
            return
        # The reason is recorded before the kill: the killed command's call may end (and read it)
        # while the kill is still running on the executor.
        s.breach = LimitExceeded(
            "memory_limit",
            f"the slot's {len(sample.pids)} processes used {used // MiB} MiB of memory together (with /tmp "
            f"{sample.tmp // MiB} MiB), over the slot's limit of {limit // MiB} MiB: all of them were killed. "
            "Use less memory at once (fewer or smaller processes, less in /tmp).",
        )
        await self._run(self._kill_uid, s.uid)
