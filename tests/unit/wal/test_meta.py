"""The consensus metadata file: round trip, atomic replace, corruption."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyspark_kudu.consensus.messages import ConfState, HardState, Snapshot, SnapshotMetadata
from pyspark_kudu.errors import CorruptionError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal import ConsensusMeta, load_meta, save_meta
from pyspark_kudu.wal.meta import META_FILE, encode_meta

META = ConsensusMeta(
    hard_state=HardState(term=7, vote="ts-2", commit=41),
    snapshot=Snapshot(SnapshotMetadata(40, 6, ConfState.of(["a", "b", "c"], ["d"])), b"\x00copy"),
    log_start_index=38,
    log_start_term=6,
    wal_start_seq=3,
)


@pytest.fixture
def tablet(tmp_path: Path) -> FileIO:
    return FileIO(str(tmp_path / "tablet"))


def test_meta_round_trips(tablet: FileIO) -> None:
    assert load_meta(tablet) is None
    save_meta(tablet, META)
    assert load_meta(tablet) == META
    save_meta(tablet, ConsensusMeta())
    assert load_meta(tablet) == ConsensusMeta()
    assert tablet.listdir() == [META_FILE]


def test_a_leftover_temp_file_is_ignored_and_removed(tablet: FileIO) -> None:
    save_meta(tablet, META)
    # What a crash between writing the temp file and the rename leaves behind.
    tablet.atomic_write(encode_meta(ConsensusMeta())[:-3], META_FILE + ".tmp-0123abcd")
    assert load_meta(tablet) == META
    assert tablet.listdir() == [META_FILE]


@pytest.mark.parametrize("offset", [0, 9, 14, 17, 30, -1])
def test_a_bit_flip_anywhere_in_meta_is_corruption(tablet: FileIO, offset: int) -> None:
    save_meta(tablet, META)
    data = bytearray(tablet.read_bytes(META_FILE))
    data[offset] ^= 0x01
    tablet.atomic_write(bytes(data), META_FILE)
    with pytest.raises(CorruptionError, match=str(tablet.path(META_FILE))):
        load_meta(tablet)


@pytest.mark.parametrize("keep", [0, 5, 19, 40])
def test_a_truncated_meta_is_corruption(tablet: FileIO, keep: int) -> None:
    save_meta(tablet, META)
    tablet.atomic_write(tablet.read_bytes(META_FILE)[:keep], META_FILE)
    with pytest.raises(CorruptionError, match="consensus metadata"):
        load_meta(tablet)
