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

Full-disk injection (tests and the fault harness; off unless :data:`FULL_DISKS_ENV` is set):
the environment variable names a small JSON file (:func:`set_disk_full`,
:func:`clear_disk_full`) listing local directories whose file system is to be treated as
full, either outright or once the files under it take more than a byte quota. A write under
such a directory then fails with ``OSError(ENOSPC)`` inside this module, at the two points
every durable write of the product passes: opening a file for writing (:meth:`FileIO.open`,
:func:`open_private`, hence :meth:`FileIO.atomic_write`) and :meth:`FileIO.fsync` (the WAL's
group sync). The product code above it -- WAL, tablet, replica handlers -- runs unchanged,
so a test sees exactly what a real full disk causes there, without root or a tmpfs. The file
is read on each check, so another process (the harness, a test) can fill and free a disk
while executors run; processes started after the variable is set inherit it. Unset, a check
costs one environment lookup.

Thread-safety: a ``FileIO`` holds only its URL and a cached fsspec filesystem, which fsspec
makes safe to share between threads. It pickles without the cache so it ships to Spark
executors (the pyiceberg habit).
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "FULL_DISKS_ENV",
    "FileIO",
    "check_disk_space",
    "clear_disk_full",
    "make_private_dirs",
    "open_private",
    "set_disk_full",
]

DIR_MODE = 0o700
"""Mode of every local directory the project creates (data roots, tablets, WAL, catalog)."""
FILE_MODE = 0o600
"""Mode of every local file created through :class:`FileIO`."""
FULL_DISKS_ENV = "PYSPARK_KUDU_FULL_DISKS"
"""Names the full-disk file of the fault injection (see the module docstring); unset in
production."""


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
    check_disk_space(path)
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
            check_disk_space(self.local_path(*parts))
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
        check_disk_space(_local_name(f) or self.local_path())
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


def _local_name(f: IO[bytes]) -> str | None:
    """The OS path of a local file object (fsspec's opener keeps it in ``path``), if known."""
    for attr in ("path", "name"):
        name = getattr(f, attr, None)
        if isinstance(name, str) and name:
            return name[len("file://"):] if name.startswith("file://") else name
    return None


# -- full-disk injection (see the module docstring) -----------------------------------------


def _full_disks(spec: str) -> dict[str, int | None]:
    """The full-disk file's entries: directory -> byte quota (None: full outright)."""
    try:
        with open(spec, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise ValueError(f"the full-disk file {spec} (${FULL_DISKS_ENV}) is not valid JSON "
                         f"({e}); write it with set_disk_full()") from e
    full = doc.get("full", {}) if isinstance(doc, dict) else {}
    return {str(d): (None if q is None else int(q)) for d, q in full.items()}


def _bytes_under(root: str) -> int:
    total = 0
    for parent, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue  # removed meanwhile
    return total


def check_disk_space(path: str) -> None:
    """Raise ``OSError(ENOSPC)`` if the full-disk file (:data:`FULL_DISKS_ENV`) declares the
    file system under ``path`` full: a listed directory contains ``path`` and has no quota,
    or the files under it take more than its quota. Returns at once when the variable is
    unset (production).

    Raises:
        OSError: ``errno.ENOSPC``, the error a full disk gives the same call.
        ValueError: the full-disk file is not what :func:`set_disk_full` writes.
    """
    spec = os.environ.get(FULL_DISKS_ENV)
    if not spec:
        return
    target = os.path.abspath(path)
    for root, quota in _full_disks(spec).items():
        if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
            continue
        if quota is None or _bytes_under(root) > quota:
            why = "full" if quota is None else f"over its quota of {quota} bytes"
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected: {root} is "
                          f"{why} in {spec})", path)


def _update_full_disks(spec: str | None, root: str, quota: int | None, remove: bool) -> None:
    spec = spec or os.environ.get(FULL_DISKS_ENV)
    if not spec:
        raise ValueError(f"no full-disk file: set ${FULL_DISKS_ENV} (before starting the "
                         f"processes that write) or pass spec=")
    full = _full_disks(spec)
    key = os.path.abspath(root)
    if remove:
        full.pop(key, None)
    else:
        full[key] = quota
    # Replaced atomically: checks in other processes read the old or the new list.
    tmp = f"{spec}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"full": full}, f)
    os.replace(tmp, spec)


def set_disk_full(root: str, max_bytes: int | None = None, *, spec: str | None = None) -> None:
    """Declare the file system under local directory ``root`` full: at once, or once the
    files under ``root`` take more than ``max_bytes``. ``spec`` is the full-disk file
    (default: the one :data:`FULL_DISKS_ENV` names; writers only see it if they have the
    variable too)."""
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, not {max_bytes}")
    _update_full_disks(spec, root, max_bytes, remove=False)


def clear_disk_full(root: str, *, spec: str | None = None) -> None:
    """Undo :func:`set_disk_full` for ``root`` (the disk has room again)."""
    _update_full_disks(spec, root, None, remove=True)
