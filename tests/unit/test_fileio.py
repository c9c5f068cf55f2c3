"""FileIO: the one file facade of wal/ and tablet/ (STYLE habit 6)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pyspark_kudu.fileio import FileIO


def test_atomic_write_replaces_content_and_leaves_no_temp_file(tmp_path: Path) -> None:
    io = FileIO(str(tmp_path))
    io.atomic_write(b"one", "tablets/t1/meta")
    io.atomic_write(b"two", "tablets/t1/meta")
    assert io.read_bytes("tablets/t1/meta") == b"two"
    assert io.listdir("tablets/t1") == ["meta"]


def test_pickled_fileio_drops_its_filesystem_cache_and_still_works(tmp_path: Path) -> None:
    io = FileIO(str(tmp_path))
    io.atomic_write(b"x", "instance")
    assert io.is_local
    clone = pickle.loads(pickle.dumps(io))
    assert clone == io
    assert clone._fs is None
    assert clone.read_bytes("instance") == b"x"


def test_memory_url_roots_work_without_durability_calls() -> None:
    io = FileIO("memory://fileio-test")
    assert not io.is_local
    io.atomic_write(b"abc", "d/f")
    assert io.read_bytes("d/f") == b"abc"
    with pytest.raises(ValueError, match="not a local file system path"):
        io.local_path("d/f")
    io.delete("d", recursive=True)
    assert not io.exists("d/f")


def test_listdir_of_missing_directory_is_empty(tmp_path: Path) -> None:
    assert FileIO(str(tmp_path)).listdir("nope") == []


def test_child_and_path_compose_relative_parts(tmp_path: Path) -> None:
    io = FileIO(str(tmp_path)).child("tablets", "t1")
    assert io.path("wal", "1.log") == f"{tmp_path}/tablets/t1/wal/1.log"
    assert io.local_path("meta") == f"{tmp_path}/tablets/t1/meta"


def test_empty_root_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        FileIO("")


def test_atomic_write_creates_a_missing_root(tmp_path: Path) -> None:
    io = FileIO(str(tmp_path / "not-yet"))
    io.atomic_write(b"uuid", "instance")
    assert io.read_bytes("instance") == b"uuid"
