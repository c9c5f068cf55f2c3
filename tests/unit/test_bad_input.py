"""Bad input is refused with an error naming the problem, and nothing is written (issue 8).

Every test checks both halves: the error (class and text) and the absence of effects -- the
catalog's Raft index did not move (no record was proposed), no table or tablet server was
recorded, no tablet row changed.

Duplicate keys inside one batch (decided here, Kudu semantics applied row by row in batch
order, see :mod:`pyspark_kudu.tablet.apply`): INSERT keeps the first row and fails the later
ones with ``AlreadyPresent``; INSERT_IGNORE keeps the first silently; UPSERT and UPDATE end
with the last row's values; DELETE deletes once and fails the repeats with ``NotFound``;
DELETE_IGNORE deletes once silently.
"""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pyspark_kudu.errors import (
    InvalidArgumentError,
    LocationMappingError,
    LocationMappingTimedOutError,
)
from pyspark_kudu.master.catalog_replica import ReplicaOptions
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.localcluster import free_ports
from pyspark_kudu.master.locations import MAX_LOCATION_LENGTH
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.tablet import OpType, Tablet, encode_write_batch
from tests.waiting import wait_until

FAST = ReplicaOptions(tick_interval_s=0.02, election_ticks=15, heartbeat_ticks=2)
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
REPO = Path(__file__).resolve().parents[2]


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def printing(tmp_path: Path, output: str) -> str:
    """A mapping command that prints exactly ``output`` (kept in a file: no quoting games)."""
    out = tmp_path / "output.txt"
    out.write_text(output)
    return script(tmp_path, "print.sh", f"cat '{out}'\n")


def catalog_index(g: EmbeddedMaster) -> int:
    return g.leader().catalog.index


def tserver(i: int) -> TServerMeta:
    return TServerMeta(f"ts{i}", f"127.0.0.{i + 2}", 7050, f"/data/ts{i}")


@pytest.fixture
def three_tservers(tmp_path: Path) -> Iterator[tuple[EmbeddedMaster, MasterClient]]:
    """A one-replica embedded master with three registered tablet servers."""
    with EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST) as g, g.client() as c:
        g.leader()
        for i in range(3):
            c.heartbeat_to(g.addresses["m1"], tserver(i))
        wait_until(lambda: len(g.leader().catalog.tservers) == 3, 5, "3 registrations")
        yield g, c


# -- the location mapping command ------------------------------------------------------------


def _registration_is_refused(g: EmbeddedMaster, c: MasterClient, match: str,
                             err: type[Exception] = LocationMappingError) -> None:
    before = catalog_index(g)
    with pytest.raises(err, match=match):
        c.heartbeat_to(g.addresses["m1"], tserver(0))
    assert c.list_tservers() == []
    assert catalog_index(g) == before
    # An unregistered server can hold no replica: a table cannot be placed on it.
    with pytest.raises(InvalidArgumentError, match="0 tablet servers are alive"):
        c.create_table("t", SCHEMA, replication_factor=1)
    assert c.list_tables() == [] and catalog_index(g) == before


@pytest.mark.parametrize(("output", "match"), [
    ("dc1/rack1\n", r"returned invalid location: dc1/rack1$"),
    ("\n", r"returned invalid empty location$"),
    ("/" + "r" * MAX_LOCATION_LENGTH + "\n", r"characters long, more than the maximum 1024"),
    ("/dc1/rack 1\n", r"returned invalid location: /dc1/rack 1$"),
    ("/dc1/r$ck;1\n", r"returned invalid location: /dc1/r\$ck;1$"),
    ("/dc1//rack1\n", r"returned invalid location: /dc1//rack1$"),
    ("/dc1/rack1/\n", r"returned invalid location: /dc1/rack1/$"),
    ("/dc1\n/dc2\n", r"returned invalid location: /dc1\n/dc2$"),
    ("/dc1/räck\n", r"returned invalid location: /dc1/räck$"),
])
def test_an_invalid_location_refuses_the_registration_and_records_nothing(
    tmp_path: Path, output: str, match: str,
) -> None:
    with EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST,
                        location_mapping_cmd=printing(tmp_path, output)) as g, g.client() as c:
        g.leader()
        _registration_is_refused(g, c, match)


def test_a_location_of_the_maximum_length_is_accepted(tmp_path: Path) -> None:
    longest = "/" + "r" * (MAX_LOCATION_LENGTH - 1)
    with EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST,
                        location_mapping_cmd=printing(tmp_path, longest + "\n")) as g, \
            g.client() as c:
        g.leader()
        c.heartbeat_to(g.addresses["m1"], tserver(0))
        assert [t["location"] for t in c.list_tservers()] == [longest]


def test_a_failing_mapping_command_refuses_the_registration_with_its_stderr(
    tmp_path: Path,
) -> None:
    cmd = script(tmp_path, "fail.sh", "echo 'rack database is down' >&2\nexit 3\n")
    with EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST,
                        location_mapping_cmd=cmd) as g, g.client() as c:
        g.leader()
        _registration_is_refused(
            g, c, r"non-zero exit status 3: rack database is down")


def test_a_hanging_mapping_command_times_out_after_the_configured_time(
    tmp_path: Path,
) -> None:
    cmd = script(tmp_path, "hang.sh", "sleep 60\necho /never\n")
    with EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST, location_mapping_cmd=cmd,
                        location_mapping_timeout_s=0.3) as g, g.client() as c:
        g.leader()
        start = time.monotonic()
        _registration_is_refused(g, c, r"did not finish within 0\.3 s and was killed",
                                 LocationMappingTimedOutError)
        assert time.monotonic() - start < 30  # did not hang: the command sleeps 60 s


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("nan")])
def test_a_nonpositive_mapping_timeout_is_refused(tmp_path: Path, timeout: float) -> None:
    with pytest.raises(InvalidArgumentError, match="location mapping timeout must be a positive"):
        EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST, location_mapping_cmd="/bin/true",
                       location_mapping_timeout_s=timeout)


def test_unbalanced_quotes_in_the_mapping_command_are_refused(tmp_path: Path) -> None:
    with EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST,
                        location_mapping_cmd="/bin/echo '/dc1") as g, g.client() as c:
        g.leader()
        _registration_is_refused(g, c, r"invalid location mapping command .*No closing quotation")


def test_master_run_takes_the_mapping_timeout_from_its_command_line(tmp_path: Path) -> None:
    """A real ``pyspark-kudu master run`` process: the heartbeat comes back over Flight
    with the timeout error instead of hanging for the script's 60 s."""
    cmd = script(tmp_path, "hang.sh", "sleep 60\necho /never\n")
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    log = tmp_path / "master.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyspark_kudu.tools.cli", "master", "run", "--id", "m1",
             "--peers", f"m1={addr}", "--data-dir", str(tmp_path / "m1"),
             "--location-mapping-cmd", cmd, "--location-mapping-timeout-s", "0.4",
             "--log-level", "WARNING"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO)
    try:
        with MasterClient(addr, timeout_s=30) as c:
            c.leader_address(timeout_s=30)
            start = time.monotonic()
            with pytest.raises(LocationMappingTimedOutError, match=r"did not finish within 0\.4 s"):
                c.heartbeat_to(addr, tserver(0))
            assert time.monotonic() - start < 20  # did not hang (the message names 0.4 s)
            assert c.list_tservers() == []
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- table names and replication factors ------------------------------------------------------


@pytest.mark.parametrize(("name", "match"), [
    ("a/b", "path separator '/'"),
    ("../../etc", "path separator '/'"),
    ("..", r"may not be '\.' or contain '\.\.'"),
    ("x..y", r"contain '\.\.'"),
    (".", r"may not be '\.'"),
    ("a\\b", "path separator"),
    ("", "must not be empty"),
    ("a\x00b", "control characters"),
    ("t" * 257, "longer than maximum permitted length 256"),
])
def test_a_bad_table_name_creates_nothing(
    three_tservers: tuple[EmbeddedMaster, MasterClient], name: str, match: str,
) -> None:
    g, c = three_tservers
    before = catalog_index(g)
    with pytest.raises(InvalidArgumentError, match=match) as info:
        c.create_table(name, SCHEMA, replication_factor=3)
    assert "invalid table name" in str(info.value)
    assert c.list_tables() == [] and catalog_index(g) == before
    assert len(g.leader().catalog.tablets) == 0


def test_a_bad_column_name_creates_nothing(
    three_tservers: tuple[EmbeddedMaster, MasterClient],
) -> None:
    g, c = three_tservers
    before = catalog_index(g)
    bad = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("../v", "string")),
                 ("id",))
    with pytest.raises(InvalidArgumentError, match=r"invalid column name '\.\./v'"):
        c.create_table("t", bad, replication_factor=3)
    assert c.list_tables() == [] and catalog_index(g) == before


@pytest.mark.parametrize(("rf", "match"), [
    (4, r"^illegal replication factor 4: replication factor must be odd$"),
    (2, r"^illegal replication factor 2: replication factor must be odd$"),
    (9, r"^illegal replication factor 9: maximum allowed replication factor is 7"),
    (0, r"^illegal replication factor 0: minimum allowed replication factor is 1"),
    (-3, r"^illegal replication factor -3: minimum allowed replication factor is 1"),
    # Kudu's CreateTable text when RF exceeds the live servers (catalog_manager.cc).
    (5, r"^not enough live tablet servers to create a table with the requested replication "
        r"factor 5; 3 tablet servers are alive$"),
])
def test_a_bad_replication_factor_creates_nothing(
    three_tservers: tuple[EmbeddedMaster, MasterClient], rf: int, match: str,
) -> None:
    g, c = three_tservers
    before = catalog_index(g)
    with pytest.raises(InvalidArgumentError, match=match):
        c.create_table("t", SCHEMA, replication_factor=rf)
    assert c.list_tables() == [] and catalog_index(g) == before
    c.create_table("t", SCHEMA, replication_factor=3)  # the name was not taken
    assert c.list_tables() == ["t"]


# -- values of the wrong type -------------------------------------------------------------------


@pytest.mark.parametrize(("column", "values", "match"), [
    ("id", pa.array(["12", "13"]), "column 'id': cannot convert string values to int64"),
    ("id", pa.array([1.5, 2.0]), "column 'id': cannot convert double values to int64"),
    ("id", pa.array([True, False]), "column 'id': cannot convert bool values to int64"),
    ("v", pa.array([1, 2]), "column 'v': cannot convert int64 values to string"),
    ("v", pa.array([b"a", b"b"]), "column 'v': cannot convert binary values to string"),
])
def test_values_of_another_type_family_are_refused_whatever_their_content(
    column: str, values: pa.Array, match: str,
) -> None:
    cols = {"id": pa.array([1, 2]), "v": pa.array(["a", "b"]), column: values}
    with pytest.raises(InvalidArgumentError, match=match):
        encode_write_batch(SCHEMA, OpType.UPSERT, pa.table(cols))


def test_values_are_converted_within_a_family_and_overflow_is_refused() -> None:
    narrow = Schema((ColumnSchema("id", "int8", nullable=False),
                     ColumnSchema("ts", "timestamp[us, tz=UTC]")), ("id",))
    ok = pa.table({"id": pa.array([1, 2], pa.int64()),
                   "ts": pa.array([0, 1], pa.timestamp("ms", tz="Europe/Paris"))})
    encode_write_batch(narrow, OpType.UPSERT, ok)
    encode_write_batch(narrow, OpType.UPSERT, pa.table({"id": [1], "ts": pa.nulls(1)}))
    with pytest.raises(InvalidArgumentError, match="column 'id': cannot convert int64 values"):
        encode_write_batch(narrow, OpType.UPSERT, pa.table({"id": [300]}))


def _struct(**types: object) -> StructType:
    return StructType([StructField(n, t, True) for n, t in types.items()])  # type: ignore[arg-type]


@pytest.mark.parametrize(("struct", "match"), [
    (_struct(id=StringType(), v=StringType()),
     r"DataFrame column 'id' has type string, the table column is int64 \(a primary key "
     r"column\); cast it first, e.g. df.withColumn\('id', df\['id'\].cast\('bigint'\)\)"),
    (_struct(id=DoubleType(), v=StringType()),
     r"DataFrame column 'id' has type double, the table column is int64 \(a primary key"),
    (_struct(id=LongType(), v=LongType()),
     r"DataFrame column 'v' has type bigint, the table column is string;"),
    (_struct(id=LongType(), v=ArrayType(StringType())),
     r"column 'v' has unsupported Spark type array<string>"),
])
def test_the_driver_side_type_check_names_the_column_and_the_cast(
    struct: StructType, match: str,
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        SCHEMA.check_write_types(struct, "t")


def test_the_driver_side_type_check_accepts_same_family_types_and_extra_columns() -> None:
    SCHEMA.check_write_types(_struct(id=IntegerType(), v=StringType(), extra=DoubleType()), "t")
    SCHEMA.check_write_types(_struct(id=LongType()), "t")


# -- null and duplicate keys inside one batch ---------------------------------------------------


def _apply(tablet: Tablet, op: OpType, rows: pa.Table) -> list[tuple[int, str]]:
    index = tablet.applied_index + 1
    return [(e.row, e.status)
            for e in tablet.apply(index, encode_write_batch(SCHEMA, op, rows)).errors]


def _rows(tablet: Tablet) -> dict[int, str | None]:
    return {r["id"]: r["v"] for r in tablet.scan_table().to_pylist()}


@pytest.mark.parametrize("op", list(OpType))
def test_a_null_key_refuses_the_whole_batch_for_every_operation(op: OpType) -> None:
    rows = pa.table({"id": pa.array([1, None], pa.int64()), "v": ["a", "b"]})
    with pytest.raises(InvalidArgumentError, match=r"row 1: column 'id' is NOT NULL"):
        encode_write_batch(SCHEMA, op, rows)


@pytest.mark.parametrize(("op", "existing", "errors", "after"), [
    (OpType.INSERT, {}, [(1, "AlreadyPresent")], {1: "first", 2: "x"}),
    (OpType.INSERT_IGNORE, {}, [], {1: "first", 2: "x"}),
    (OpType.UPSERT, {}, [], {1: "second", 2: "x"}),
    (OpType.UPSERT, {1: "old"}, [], {1: "second", 2: "x"}),
    (OpType.UPDATE, {1: "old", 2: "old"}, [], {1: "second", 2: "x"}),
    (OpType.UPDATE, {2: "old"}, [(0, "NotFound"), (1, "NotFound")], {2: "x"}),
    (OpType.UPDATE_IGNORE, {1: "old", 2: "old"}, [], {1: "second", 2: "x"}),
    (OpType.DELETE, {1: "old", 2: "old"}, [(1, "NotFound")], {}),
    (OpType.DELETE_IGNORE, {1: "old", 2: "old"}, [], {}),
], ids=lambda v: v.name.lower() if isinstance(v, OpType) else None)
def test_a_key_repeated_in_one_batch_follows_kudu_semantics_in_batch_order(
    tmp_path: Path, op: OpType, existing: dict[int, str], errors: list[tuple[int, str]],
    after: dict[int, str],
) -> None:
    tablet = Tablet.create(str(tmp_path), "t1", SCHEMA)
    if existing:
        assert _apply(tablet, OpType.INSERT, pa.table(
            {"id": pa.array(list(existing), pa.int64()), "v": list(existing.values())})) == []
    batch = pa.table({"id": pa.array([1, 1, 2], pa.int64()), "v": ["first", "second", "x"]})
    assert _apply(tablet, op, batch) == errors
    assert _rows(tablet) == after
