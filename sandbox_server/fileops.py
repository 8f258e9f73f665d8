"""File operations confined to a workspace directory, safe against symlink races and FIFOs.

Every path is walked one component at a time from the workspace's directory descriptor
with O_NOFOLLOW, so a symlink swapped in by a concurrent command is refused rather than
followed onto the host; files are opened with O_NONBLOCK and must be regular files (a FIFO
or device is refused at once instead of parking a thread in open()). Used by
sandbox_server and by the local workspace executor (tools/executor.py): one implementation.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from dataclasses import dataclass

from sandbox_server.tree import DEFAULT_MAX_DEPTH, walk

__all__ = [
    "Workspace",
    "FileOpError",
    "PathEscape",
    "NotFound",
    "IsDirectory",
    "NotRegular",
    "TooLarge",
    "QuotaExceeded",
    "error_for",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SKIP_DIRS = frozenset({".git"})


class FileOpError(Exception):
    """A refused or failed file operation; `kind` is the API's error kind."""

    kind = "bad_request"


class PathEscape(FileOpError, PermissionError):
    kind = "path_escape"


class NotFound(FileOpError, FileNotFoundError):
    kind = "not_found"


class IsDirectory(FileOpError, IsADirectoryError):
    kind = "is_directory"


class NotRegular(FileOpError):
    kind = "not_regular"


class TooLarge(FileOpError):
    kind = "too_large"


class QuotaExceeded(FileOpError):
    """The slot's workspace is (or would be) over its disk quota."""

    kind = "quota_exceeded"


_BY_KIND = {c.kind: c for c in (FileOpError, PathEscape, NotFound, IsDirectory, NotRegular, TooLarge, QuotaExceeded)}


def error_for(kind: str, message: str) -> FileOpError | None:
    """The exception a remote file operation's error kind stands for (None: not a file-op error)."""
    cls = _BY_KIND.get(kind)
    return cls(message) if cls is not None else None


@dataclass(frozen=True)
class Workspace:
    """A directory on the host, as `mount` (e.g. /workspace) is shown to commands.

    `owner` (uid, gid): files and directories created here are handed to the slot's user,
    so its commands can change what the tools wrote.
    """

    root: str
    mount: str | None = None
    owner: tuple[int, int] | None = None
    max_file_bytes: int = 64 * 1024 * 1024
    max_depth: int = DEFAULT_MAX_DEPTH  # directories a path may nest

    def parts(self, path: object) -> list[str]:
        """Split a path as the agent sees it into workspace-relative components, refusing escapes."""
        if not isinstance(path, str) or not path:
            raise FileOpError("'path' must be a non-empty string")
        if "\x00" in path:
            raise FileOpError(f"path {path!r} contains a NUL byte; use a plain file name")
        if path.startswith("/"):
            prefixes = [p.rstrip("/") for p in (self.mount, self.root) if p]
            for prefix in prefixes:
                if path == prefix or path.startswith(prefix + "/"):
                    path = path[len(prefix) :]
                    break
            else:
                shown = self.mount or self.root
                raise PathEscape(f"path {path!r} is outside the workspace {shown!r}; use a path inside it")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise PathEscape(f"path {path!r} contains '..', which may lead outside the workspace; use a path inside it")
        if len(parts) - 1 > self.max_depth:
            raise FileOpError(
                f"path {path[:80]!r}... nests {len(parts) - 1} directories; the workspace allows {self.max_depth} levels: "
                "use a shallower path"
            )
        return parts

    # -- walking -----------------------------------------------------------------------------
    def _open_dir(self, parts: list[str], path: str, *, create: bool) -> int:
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for part in parts:
                try:
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise NotFound(f"file not found: {path!r}") from None
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if self.owner:
                        os.chown(part, *self.owner, dir_fd=fd, follow_symlinks=False)
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except (NotADirectoryError, OSError) as exc:
                    if isinstance(exc, OSError) and exc.errno not in (20, 40):  # ENOTDIR, ELOOP
                        raise
                    raise self._not_dir(part, path, fd) from None
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _not_dir(part: str, path: str, dir_fd: int) -> FileOpError:
        try:
            st = os.lstat(part, dir_fd=dir_fd)
        except OSError:
            return NotFound(f"file not found: {path!r}")
        if stat.S_ISLNK(st.st_mode):
            return PathEscape(
                f"{part!r} in path {path!r} is a symbolic link; file tools do not follow links (one may lead outside the "
                "workspace): use the real path"
            )
        return IsDirectory(f"{part!r} in path {path!r} is not a directory")

    def _open_file(self, path: object, flags: int, *, create: bool = False) -> int:
        parts = self.parts(path)
        assert isinstance(path, str)  # parts() refused anything else
        if not parts:
            raise IsDirectory(f"{path!r} is the workspace directory; give a file path")
        dfd = self._open_dir(parts[:-1], path, create=create)
        name = parts[-1]
        try:
            try:
                fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            except FileNotFoundError:
                raise NotFound(f"file not found: {path!r}") from None
            except OSError as exc:
                # ELOOP: a symlink; ENXIO: a FIFO without a reader (opened for writing)
                if exc.errno == 40:
                    raise PathEscape(
                        f"{path!r} is a symbolic link; file tools do not follow links (one may lead outside the workspace): "
                        "use the real path"
                    ) from None
                if exc.errno in (6, 21):  # ENXIO, EISDIR
                    st = os.lstat(name, dir_fd=dfd)
                    raise self._not_regular(path, st.st_mode) from None
                raise
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise self._not_regular(path, st.st_mode)
            if create and self.owner and st.st_uid != self.owner[0]:
                os.fchown(fd, *self.owner)
            return fd
        finally:
            os.close(dfd)

    @staticmethod
    def _not_regular(path: str, mode: int) -> FileOpError:
        if stat.S_ISDIR(mode):
            return IsDirectory(f"{path!r} is a directory; give a file path")
        return NotRegular(f"{path!r} is not a regular file (a FIFO, socket or device); file tools read only files")

    # -- operations ---------------------------------------------------------------------------
    def read(self, path: object) -> bytes:
        fd = self._open_file(path, os.O_RDONLY)
        try:
            # a regular file never blocks: clear O_NONBLOCK's effect by reading to EOF
            size = os.fstat(fd).st_size
            if size > self.max_file_bytes:
                raise TooLarge(f"{path!r} is {size} bytes; the limit is {self.max_file_bytes}")
            chunks = []
            total = 0
            while chunk := os.read(fd, 1 << 20):
                total += len(chunk)
                if total > self.max_file_bytes:
                    raise TooLarge(f"{path!r} is over the limit of {self.max_file_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def write(self, path: object, data: bytes, room: tuple[int, int] | None = None) -> tuple[int, int]:
        """Replace the file's content; `room`: bytes and entries the workspace may still grow by (its quota).

        Returns the bytes written and the entries (file, directories) it made.
        """
        if len(data) > self.max_file_bytes:
            raise TooLarge(f"{len(data)} bytes is over the limit of {self.max_file_bytes}")
        made = self._missing(path)
        if room is not None:
            self._check_room(path, len(data), room[0])
            if made > room[1]:
                raise QuotaExceeded(
                    f"writing {path!r} would make {made} new entries, putting the workspace over its limit of files "
                    f"({max(room[1], 0)} left); delete files you no longer need"
                )
        # no O_TRUNC: the file is truncated only once it is known to be a regular file
        fd = self._open_file(path, os.O_WRONLY | os.O_CREAT, create=True)
        try:
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        return len(data), made

    def _missing(self, path: object) -> int:
        """How many of the path's components (directories, then the file) do not exist yet."""
        parts = self.parts(path)
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for i, part in enumerate(parts):
                try:
                    if i == len(parts) - 1:
                        os.lstat(part, dir_fd=fd)
                        return 0
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    return len(parts) - i  # (a link or file in the way: the write fails at it anyway)
                os.close(fd)
                fd = nfd
        finally:
            os.close(fd)
        return 0

    def _check_room(self, path: object, size: int, room: int) -> None:
        # checked before the file is created, so a refused write leaves nothing behind
        try:
            fd = self._open_file(path, os.O_RDONLY)
        except NotFound:
            old = 0
        else:
            try:
                old = os.fstat(fd).st_blocks * 512
            finally:
                os.close(fd)
        block = 4096
        growth = -(-size // block) * block - old
        if growth > room:
            raise QuotaExceeded(
                f"writing {size} bytes to {path!r} would put the workspace over its disk quota "
                f"({max(room, 0)} bytes left); delete files you no longer need or write less"
            )

    def _walk(self, path: str):
        """(relative dir, dir fd, file names, dir names) below `path`, never following links."""
        parts = self.parts(path) if path not in ("", ".") else []
        top = self._open_dir(parts, path, create=False)
        try:
            base = "/".join(parts)
            for d in walk(".", dir_fd=top, max_depth=max(0, self.max_depth - len(parts))):
                d.dirs[:] = sorted(n for n in d.dirs if n not in _SKIP_DIRS)
                rel = f"{base}/{d.rel}" if base and d.rel else base or d.rel
                yield rel, d.fd, sorted(d.files), d.dirs
        finally:
            os.close(top)

    def list_files(self, path: str, limit: int = 10_000) -> dict:
        entries: list[dict] = []
        for rel, dirfd, files, _ in self._walk(path):
            for name in files:
                try:
                    st = os.lstat(name, dir_fd=dirfd)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    entries.append({"path": f"{rel}/{name}" if rel else name, "size": st.st_size})
            if len(entries) > limit:
                break
        entries.sort(key=lambda e: e["path"])
        return {"files": entries[:limit], "truncated": len(entries) > limit}

    def archive(self, path: str) -> bytes:
        """tar.gz of the regular files and directories under `path` (symlinks stored as links, FIFOs skipped)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for i, (rel, dirfd, files, dirs) in enumerate(self._walk(path)):
                if i == 0 and rel:
                    info = tarfile.TarInfo(rel)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                for name in dirs:
                    info = tarfile.TarInfo(f"{rel}/{name}" if rel else name)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                for name in files:
                    arcname = f"{rel}/{name}" if rel else name
                    try:
                        st = os.lstat(name, dir_fd=dirfd)
                    except OSError:
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        info = tarfile.TarInfo(arcname)
                        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dirfd)
                        tar.addfile(info)
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    try:
                        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
                    except OSError:
                        continue
                    with os.fdopen(fd, "rb") as fh:
                        fst = os.fstat(fh.fileno())
                        if not stat.S_ISREG(fst.st_mode):
                            continue
                        info = tarfile.TarInfo(arcname)
                        info.size, info.mode, info.mtime = fst.st_size, fst.st_mode & 0o777, int(fst.st_mtime)
                        tar.addfile(info, fh)
                if buf.tell() > self.max_file_bytes:
                    raise TooLarge(f"archive of {path!r} is over {self.max_file_bytes} bytes")
        return buf.getvalue()
