"""One small, picklable file-system facade used by ``wal/`` and ``tablet/`` (STYLE habit 6).

A data root is an fsspec URL (``/data/kudu``, ``file:///data/kudu``, ``memory://t1`` ...).
Local paths are the default and the only kind with real durability: :meth:`FileIO.fsync`
and :meth:`FileIO.fsync_dir` call ``os.fsync`` on local files and are documented no-ops
elsewhere (object stores make a written object durable on close).

:meth:`FileIO.atomic_write` is the one way metadata files (``instance``, ``meta``,
``superblock``) are replaced: write a temp file, fsync it, rename it over the target, fsync
the directory (DESIGN §5). A crash at any point leaves either the old or the new content.

Permissions: on local disk, directories FileIO creates get mode ``0700`` and files ``0600``
(:data:`DIR_MODE`, :data:`FILE_MODE`), whatever the process umask, like Kudu's default
``--umask=077``: replica files, WAL segments, consensus metadata and the catalog are never
readable, let alone writable, by other users. The modes are passed to ``mkdir``/``open``,
which the umask can only narrow; existing files and directories keep theirs (an operator who
wants group access creates the data root with it).

Thread-safety: a ``FileIO`` holds only its URL and a cached fsspec filesystem, which fsspec
makes safe to share between threads. It pickles without the cache so it ships to Spark
executors (the pyiceberg habit).
"""

from __future__ import annotations

import os
import uuid
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = ["DIR_MODE", "FILE_MODE", "FileIO", "make_private_dirs", "open_private"]

DIR_MODE = 0o700
"""Mode of every local directory the project creates (data roots, tablets, WAL, catalog)."""
FILE_MODE = 0o600
"""Mode of every local file created through :class:`FileIO`."""


def make_private_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, but every directory it creates gets
    :data:`DIR_MODE` (``os.makedirs`` gives intermediate directories ``0777 & ~umask``)."""
    missing: list[str] = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(d):
                raise


def open_private(path: str, mode: str = "wb") -> IO[Any]:
    """``open(path, mode)`` for writing (``w``/``a``, text or binary) that creates the file
    with :data:`FILE_MODE` whatever the umask."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, FILE_MODE), mode)


class FileIO:
    """File operations under one root URL. Paths given to methods are relative to the root."""

    def __init__(self, root: str) -> None:
        if not root:
            raise ValueError("FileIO root must be a non-empty path or URL")
        self._root = root.rstrip("/") or "/"
        self._fs: fsspec.AbstractFileSystem | None = None

    # -- pickling: drop the cached filesystem ------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"_root": self._root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._root = state["_root"]
        self._fs = None

    def __repr__(self) -> str:
        return f"FileIO({self._root!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FileIO) and other._root == self._root

    def __hash__(self) -> int:
        return hash(self._root)

    # -- basics --------------------------------------------------------------------------
    @property
    def root(self) -> str:
        return self._root

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            fs, _ = fsspec.core.url_to_fs(self._root)
            self._fs = fs
        return self._fs

    @property
    def is_local(self) -> bool:
        """True when the root is on the local file system (real fsync, preallocation)."""
        return isinstance(self.fs, LocalFileSystem)

    def child(self, *parts: str) -> FileIO:
        """A FileIO rooted at a sub-directory."""
        return FileIO(self.path(*parts))

    def path(self, *parts: str) -> str:
        """The full path/URL of ``parts`` under the root."""
        clean = [p.strip("/") for p in parts if p and p.strip("/")]
        if not clean:
            return self._root
        base = self._root if self._root != "/" else ""
        return base + "/" + "/".join(clean)

    def local_path(self, *parts: str) -> str:
        """The OS path of ``parts``; only valid when :attr:`is_local`."""
        if not self.is_local:
            raise ValueError(f"{self._root} is not a local file system path")
        full = self.path(*parts)
        return full[len("file://"):] if full.startswith("file://") else full

    # -- queries -------------------------------------------------------------------------
    def exists(self, *parts: str) -> bool:
        return bool(self.fs.exists(self.path(*parts)))

    def size(self, *parts: str) -> int:
        return int(self.fs.size(self.path(*parts)))

    def listdir(self, *parts: str) -> list[str]:
        """Names (not paths) of the entries in a directory, sorted; [] if it does not exist."""
        target = self.path(*parts)
        if not self.fs.exists(target):
            return []
        names = [str(p).rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(target, detail=False)]
        return sorted(names)

    # -- mutation ------------------------------------------------------------------------
    def makedirs(self, *parts: str) -> None:
        """Create the directory and its missing parents (``0700`` on local disk)."""
        if self.is_local:
            make_private_dirs(self.local_path(*parts))
        else:
            self.fs.makedirs(self.path(*parts), exist_ok=True)

    def open(self, *parts: str, mode: str = "rb") -> IO[bytes]:
        """Open a file; on local disk a file created here gets :data:`FILE_MODE`."""
        if self.is_local and any(c in mode for c in "wax"):
            # Create it ourselves with an explicit mode (fsspec's open would use 0666 & ~umask).
            flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if "x" in mode else 0)
            os.close(os.open(self.local_path(*parts), flags, FILE_MODE))
            mode = mode.replace("x", "w")
        f: IO[bytes] = self.fs.open(self.path(*parts), mode)
        return f

    def read_bytes(self, *parts: str) -> bytes:
        data: bytes = self.fs.cat_file(self.path(*parts))
        return data

    def delete(self, *parts: str, recursive: bool = False) -> None:
        target = self.path(*parts)
        if self.fs.exists(target):
            self.fs.rm(target, recursive=recursive)

    def rename(self, src: str, dst: str) -> None:
        """Rename within the root. Atomic on local file systems (``os.replace``)."""
        if self.is_local:
            os.replace(self.local_path(src), self.local_path(dst))
        else:
            self.fs.mv(self.path(src), self.path(dst))

    # -- durability ----------------------------------------------------------------------
    def fsync(self, f: IO[bytes], data_only: bool = False) -> None:
        """Flush ``f`` and make it durable: ``fdatasync`` if ``data_only`` else ``fsync``."""
        f.flush()
        if not self.is_local:
            return
        fileno = _fileno(f)
        if data_only and hasattr(os, "fdatasync"):
            os.fdatasync(fileno)
        else:
            os.fsync(fileno)

    def fsync_dir(self, *parts: str) -> None:
        """Make a directory's entries (creations, renames) durable. No-op off local disk."""
        if not self.is_local:
            return
        fd = os.open(self.local_path(*parts), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def atomic_write(self, data: bytes, *parts: str) -> None:
        """Replace the file at ``parts`` with ``data`` so a crash leaves old or new, never a mix."""
        target = "/".join(p.strip("/") for p in parts)
        parent = target.rsplit("/", 1)[0] if "/" in target else ""
        tmp = f"{target}.tmp-{uuid.uuid4().hex}"
        self.makedirs(parent)  # the root itself too, when the target has no parent
        with self.open(tmp, mode="wb") as f:
            f.write(data)
            self.fsync(f)
        self.rename(tmp, target)
        self.fsync_dir(parent)


def _fileno(f: IO[bytes]) -> int:
    """The OS descriptor behind an fsspec local file object (it wraps a real file in ``.f``)."""
    try:
        return f.fileno()
    except (AttributeError, OSError, ValueError):
        inner = getattr(f, "f", None)
        if inner is None:
            raise
        return int(inner.fileno())
