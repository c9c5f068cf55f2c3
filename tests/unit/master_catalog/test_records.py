"""Catalog records: canonical bytes, round trips, validation on construction."""

from __future__ import annotations

import pytest

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.entities import MemberType, ReplicaMeta, TServerMeta
from pyspark_kudu.master.records import (
    AddColumn,
    AlterTable,
    CreateTable,
    DeleteTable,
    DropColumn,
    Record,
    RegisterTServer,
    RenameColumn,
    RenameTable,
    SetReplaceMark,
    TabletReport,
    UpdateTablets,
    decode_record,
    encode_record,
)
from pyspark_kudu.schema import ColumnSchema

from .helpers import HASH2_RANGE2, create, with_tservers


def _all_records() -> list[Record]:
    c = with_tservers(3)
    return [
        create(c, partition_schema=HASH2_RANGE2),
        DeleteTable("tid"),
        AlterTable("tid", (RenameTable("n2"), AddColumn(ColumnSchema("c", "int32", default=7)),
                           DropColumn("v"), RenameColumn("a", "b"))),
        RegisterTServer(TServerMeta("ts9", "h", 7050, "/d", "/dc1/r1")),
        UpdateTablets("ts0", (TabletReport("tb", 3, "ts0", 10, 2,
                                           (ReplicaMeta("ts0"),
                                            ReplicaMeta("ts1", MemberType.NON_VOTER, True)), 1),
                              TabletReport("tb2", 1))),
        SetReplaceMark("tb", "ts1", False),
    ]


@pytest.mark.parametrize("record", _all_records(), ids=lambda r: type(r).__name__)
def test_every_record_round_trips_through_its_entry_bytes(record: Record) -> None:
    data = encode_record(record)
    assert decode_record(data) == record
    assert encode_record(decode_record(data)) == data


def test_create_table_is_one_record_carrying_every_tablet() -> None:
    rec = create(with_tservers(3), partition_schema=HASH2_RANGE2)
    assert isinstance(rec, CreateTable)
    assert len(rec.tablets) == 4
    assert all(len(t.replicas) == 3 for t in rec.tablets)


def test_create_table_refuses_tablets_that_do_not_match_the_table() -> None:
    rec = create(with_tservers(3))
    with pytest.raises(InvalidArgumentError, match="differ from the table's tablet ids"):
        CreateTable(rec.table, ())


@pytest.mark.parametrize("data", [b"{", b"[]", b'{"op":"drop_database"}', b'{"op":"delete_table"}'])
def test_malformed_entries_are_invalid_argument(data: bytes) -> None:
    with pytest.raises(InvalidArgumentError, match="catalog record"):
        decode_record(data)


def test_alter_without_steps_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="has no steps"):
        AlterTable("tid", ())


def test_alter_steps_validate_new_names() -> None:
    with pytest.raises(InvalidArgumentError, match="path separator"):
        RenameTable("a/b")
    with pytest.raises(InvalidArgumentError, match=r"'\.\.'"):
        RenameColumn("a", "x..y")
