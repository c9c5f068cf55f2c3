"""FileIO: the one file facade of wal/ and tablet/ (STYLE habit 6)."""

from __future__ import annotations

import errno
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_kudu.fileio import (
    FULL_DISKS_ENV,
    FileIO,
    clear_disk_full,
    open_private,
    set_disk_full,
)

REPO = Path(__file__).resolve().parents[2]


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


# == full-disk injection (PYSPARK_KUDU_FULL_DISKS) ===============================================


@pytest.fixture
def full_disks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    spec = tmp_path / "full-disks.json"
    monkeypatch.setenv(FULL_DISKS_ENV, str(spec))
    return spec


def test_a_root_declared_full_fails_writes_with_enospc_and_others_still_write(
    tmp_path: Path, full_disks: Path,
) -> None:
    full, other = FileIO(str(tmp_path / "full")), FileIO(str(tmp_path / "other"))
    full.atomic_write(b"before", "instance")
    set_disk_full(str(tmp_path / "full"))
    with pytest.raises(OSError) as e:
        full.atomic_write(b"after", "instance")
    assert e.value.errno == errno.ENOSPC and "injected" in str(e.value)
    with pytest.raises(OSError) as e:
        open_private(full.local_path("loose"), "wb")
    assert e.value.errno == errno.ENOSPC
    assert full.read_bytes("instance") == b"before", "reads go on on a full disk"
    other.atomic_write(b"fine", "instance")
    clear_disk_full(str(tmp_path / "full"))
    full.atomic_write(b"after", "instance")
    assert full.read_bytes("instance") == b"after"


def test_a_byte_quota_fails_the_sync_that_takes_the_root_over_it(
    tmp_path: Path, full_disks: Path,
) -> None:
    io = FileIO(str(tmp_path / "small"))
    set_disk_full(str(tmp_path / "small"), max_bytes=4096)
    io.atomic_write(b"x" * 1000, "a")
    with io.open("seg", mode="wb") as f:  # opening is fine: 1000 bytes are used
        f.write(b"y" * 8192)
        with pytest.raises(OSError) as e:
            io.fsync(f)  # the WAL's group sync is where a real full disk reports it too
    assert e.value.errno == errno.ENOSPC and "quota of 4096" in str(e.value)
    with pytest.raises(OSError):
        io.atomic_write(b"z", "b")  # now over the quota: nothing more is written
    io.delete("seg")
    io.atomic_write(b"z", "b")


def test_another_process_sees_the_disk_fill_and_free(tmp_path: Path, full_disks: Path) -> None:
    root = tmp_path / "root"
    write = [sys.executable, "-c", "import sys; from pyspark_kudu.fileio import FileIO; "
             "FileIO(sys.argv[1]).atomic_write(b'x', 'f')", str(root)]
    set_disk_full(str(root))
    proc = subprocess.run(write, capture_output=True, text=True, check=False, cwd=REPO)
    assert proc.returncode != 0 and "No space left on device" in proc.stderr, proc.stderr
    clear_disk_full(str(root))
    proc = subprocess.run(write, capture_output=True, text=True, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert (root / "f").read_bytes() == b"x"


def test_without_the_variable_nothing_is_injected(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "full-disks.json"
    set_disk_full(str(tmp_path), spec=str(spec))
    monkeypatch.delenv(FULL_DISKS_ENV, raising=False)
    FileIO(str(tmp_path / "r")).atomic_write(b"x", "f")
    with pytest.raises(ValueError, match=FULL_DISKS_ENV):
        set_disk_full(str(tmp_path))
