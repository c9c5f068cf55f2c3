"""KuduContext in local mode: virtual tablet servers, real barrier stages, real files."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.consensus.messages import EntryType
from pyspark_kudu.errors import InvalidArgumentError, RowWriteError
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.schema import Predicate
from pyspark_kudu.spark.api.context import KuduContext, WriteProgress
from pyspark_kudu.spark.host.handlers import mark_failed, replica_storage, tablet_dir
from tests.waiting import wait_until

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])


@pytest.fixture
def kudu(spark: SparkSession, tmp_path: Path) -> Iterator[KuduContext]:
    with KuduContext(spark, warehouse=str(tmp_path / "wh")) as ctx:
        yield ctx


def test_rows_written_are_read_back_exactly(spark: SparkSession, kudu: KuduContext) -> None:
    kudu.create_table("people", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 3),)))
    assert kudu.table_exists("people")
    rows = [(i, f"name-{i}" if i % 4 else None) for i in range(40)]
    df = spark.createDataFrame(rows, STRUCT)
    summary = kudu.insert_rows(df, "people")
    assert summary.rows_written == 40 and summary.row_errors == 0 and summary.tablets == 3
    # The master records each tablet's leader, term and commit index (DESIGN §3).
    for t in kudu.master.get_table("people").tablets:
        assert t.leader and t.reported_term >= 2 and t.committed_index >= 3, t
    back = kudu.read_table("people").orderBy("id")
    # The read schema marks key columns (kudu.key metadata); data and nullability must match.
    assert_df_equality(back, df.orderBy("id"), ignore_metadata=True)


def test_writes_to_led_tablets_do_not_ask_which_hosts_are_unreachable(
        spark: SparkSession, kudu: KuduContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding unreachable hosts asks the driver JVM (Py4J) under the context's lock: only
    an election needs it, not every write of every writer thread (the round thread asks
    once per round, for all the writes it carries)."""
    kudu.create_table("led", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 3),)))
    asked: list[int] = []  # calls made by this (the writer's) thread
    inner = kudu.transport.unreachable
    writer = threading.current_thread()

    def counted() -> set[str]:
        if threading.current_thread() is writer:
            asked.append(1)
        return inner()

    monkeypatch.setattr(kudu.transport, "unreachable", counted)
    kudu.upsert_rows(spark.createDataFrame([(i, "a") for i in range(30)], STRUCT), "led")
    for lead in list(kudu._leaders.values()):
        lead.abandon("the test wants an election")  # as after a failed round
    kudu.upsert_rows(spark.createDataFrame([(1, "c")], STRUCT), "led")
    assert asked, "electing leaders again did not look for unreachable hosts"
    asked.clear()
    for i in range(3):
        kudu.upsert_rows(spark.createDataFrame([(i, f"b{i}")], STRUCT), "led")
    assert not asked, f"writes to led tablets asked for unreachable hosts {len(asked)} times"
    assert kudu.read_table("led").where("id = 2").collect()[0]["v"] == "b2"


def test_duplicate_inserts_are_reported_per_row_and_the_rest_is_written(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    kudu.create_table("t", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    kudu.insert_rows(spark.createDataFrame([(1, "a"), (2, "b")], STRUCT), "t")
    with pytest.raises(RowWriteError, match="AlreadyPresent") as info:
        kudu.insert_rows(spark.createDataFrame([(2, "dup"), (3, "c")], STRUCT), "t")
    assert info.value.rows_written == 1
    assert [(r["id"], s) for _, r, s, _ in info.value.errors] == [(2, "AlreadyPresent")]
    kudu.upsert_rows(spark.createDataFrame([(1, "A")], STRUCT), "t")
    kudu.delete_rows(spark.createDataFrame([(3, None)], STRUCT), "t")
    got = sorted((r["id"], r["v"]) for r in kudu.read_table("t").collect())
    assert got == [(1, "A"), (2, "b")]


def test_predicates_prune_tablets_and_filter_rows(spark: SparkSession, kudu: KuduContext) -> None:
    kudu.create_table("p", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 4),)))
    kudu.insert_rows(spark.createDataFrame([(i, str(i)) for i in range(20)], STRUCT), "p")
    one = kudu.read_table("p", predicates=[Predicate.eq("id", 7)])
    assert one.rdd.getNumPartitions() == 1
    assert [tuple(r) for r in one.collect()] == [(7, "7")]
    proj = kudu.read_table("p", columns=["v"], predicates=[Predicate.lt("id", 3)])
    assert sorted(r["v"] for r in proj.collect()) == ["0", "1", "2"]


def test_read_table_tasks_prefer_their_tablets_replica_hosts(
        spark: SparkSession, kudu: KuduContext) -> None:
    """kudu-spark's KuduRDD: each scan partition prefers the hosts of its token's replicas,
    through the Arrow map that runs the scans (one partition per token, in token order)."""
    kudu.create_table("loc", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 3),)))
    kudu.upsert_rows(spark.createDataFrame([(i, str(i)) for i in range(30)], STRUCT), "loc")
    tokens = kudu.scan_tokens("loc")
    df = kudu.read_table("loc")
    rdd = df._jdf.queryExecution().toRdd()
    sc = spark.sparkContext
    to_java = sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava
    # What the DAG scheduler places tasks by (it follows narrow dependencies to the root).
    prefs = [sorted(loc.host() for loc in to_java(sc._jsc.sc().getPreferredLocs(rdd, k)))
             for k in range(len(rdd.partitions()))]
    assert prefs == [sorted(t.preferred_hosts()) for t in tokens] and all(prefs), prefs
    assert sorted((r["id"], r["v"]) for r in df.collect()) == [(i, str(i)) for i in range(30)]


def test_bad_input_is_refused_with_a_clear_error_and_nothing_is_written(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    kudu.create_table("b", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    nullable_key = StructType([StructField("id", LongType(), True),
                               StructField("v", StringType(), True)])
    with pytest.raises(InvalidArgumentError, match="'id' is NOT NULL"):
        kudu.upsert_rows(spark.createDataFrame([(1, "a"), (None, "b")], nullable_key), "b")
    extra = StructType([*STRUCT.fields, StructField("zzz", LongType(), True)])
    with pytest.raises(InvalidArgumentError, match=r"\['zzz'\] are not in the table schema"):
        kudu.upsert_rows(spark.createDataFrame([(1, "a", 3)], extra), "b")
    with pytest.raises(InvalidArgumentError, match="lacks primary key columns"):
        kudu.upsert_rows(spark.createDataFrame([("a",)], "v string"), "b")
    with pytest.raises(InvalidArgumentError, match="Unsupported operation type 'merge'"):
        kudu.write(spark.createDataFrame([(1, "a")], STRUCT), "b", "merge")
    assert kudu.read_table("b").count() == 0
    # No staged batch outlives its write (the janitor runs after each write).
    staging = Path(kudu.warehouse) / "staging"
    wait_until(lambda: not staging.exists() or not any(staging.iterdir()), 30,
               "staging directories of the refused writes being removed")


def test_progress_reports_every_committed_batch_and_rows_never_reach_the_driver_log(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    kudu.create_table("g", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 3),)))
    seen: list[WriteProgress] = []
    df = spark.createDataFrame([(i, "x" * 20) for i in range(500)], STRUCT).repartition(2)
    # The staged path (a small write would carry its batches in the entries, on purpose).
    summary = kudu.write(df, "g", "insert", progress=seen.append, batch_rows=50,
                         small_write_bytes=0)
    assert summary.rows_written == 500
    assert seen[-1].rows_done == seen[-1].rows_total == 500
    assert seen[-1].batches_done == seen[-1].batches_total >= 10  # 500 rows, <= 50 per batch
    assert [p.rows_done for p in seen] == sorted(p.rows_done for p in seen)
    # The driver's leader log mirrors hold staged-batch refs (a few hundred bytes), never rows.
    for lead in kudu._leaders.values():
        view = lead._view
        ents = view.entries(view.first_index(), view.last_index() + 1, None)
        assert all(len(e.data) < 400 for e in ents), [len(e.data) for e in ents]
    assert kudu.read_table("g").count() == 500


def test_deleting_a_table_removes_its_replicas_and_the_name_can_be_reused(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    kudu.create_table("gone", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    kudu.insert_rows(spark.createDataFrame([(1, "a")], STRUCT), "gone")
    tablets = [t.tablet_id for t in kudu.master.get_table("gone").tablets]
    roots = [s.root for s in kudu.servers]
    assert all(Path(r, "tablets", t).exists() for r in roots if r for t in tablets)
    kudu.delete_table("gone")
    assert not kudu.table_exists("gone")
    assert not any(Path(r, "tablets", t).exists() for r in roots if r for t in tablets)
    kudu.create_table("gone", STRUCT, keys=["id"], replicas=3)
    assert kudu.read_table("gone").count() == 0


def test_an_upsert_that_returned_is_visible_to_the_next_context(
    spark: SparkSession, tmp_path: Path,
) -> None:
    wh = str(tmp_path / "shared-wh")
    df = spark.createDataFrame([(i, f"v{i}") for i in range(30)], STRUCT)
    with KuduContext(spark, warehouse=wh) as first:
        first.create_table("u", STRUCT, keys=["id"],
                           partitioning=PartitionSchema((HashDimension(("id",), 2),)))
        assert first.upsert_rows(df, "u").rows_written == 30  # returned on commit
    with KuduContext(spark, warehouse=wh) as second:  # leads nothing: reads what was reported
        assert_df_equality(second.read_table("u").orderBy("id"), df.orderBy("id"),
                           ignore_metadata=True)


def test_a_linearizable_read_commits_an_empty_entry_per_tablet_and_sees_every_write(
    spark: SparkSession, kudu: KuduContext
) -> None:
    kudu.create_table("lin", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    rows = [(i, f"v{i}") for i in range(20)]
    kudu.upsert_rows(spark.createDataFrame(rows, STRUCT), "lin")
    tablets = [t.tablet_id for t in kudu.master.get_table("lin").tablets]
    # The leaders this client holds are forgotten: a linearizable read must elect again
    # rather than trust a commit index someone reported.
    with kudu._lock:
        for tid in tablets:
            kudu._leaders.pop(tid).abandon("test: forget the leader")
    got = kudu.read_table("lin", read_mode="linearizable").collect()
    assert sorted((r["id"], r["v"]) for r in got) == rows
    roots = {s.uuid: s.root for s in kudu.servers}
    for tid in tablets:
        lead = kudu._leaders[tid]
        assert lead.node is not None
        root = roots[lead.leader_id]
        assert root is not None
        with replica_storage(root, tid) as st:
            last = st.entries(st.last_index() - 1, st.last_index() + 1)
        # The new term's no-op, then the read's own empty entry (before them: the batches).
        assert [(e.type, e.data, e.term) for e in last] == [
            (EntryType.NORMAL, b"", lead.node.term)] * 2, last
        assert lead.node.commit_index >= last[1].index
    with pytest.raises(InvalidArgumentError, match="unknown read mode 'snapshot'"):
        kudu.read_table("lin", read_mode="snapshot")


def test_a_linearizable_read_is_served_by_a_follower_when_the_leader_replica_failed(
    spark: SparkSession, kudu: KuduContext
) -> None:
    """The leader lives in the driver; its replica on a host can fail on its own (a WAL
    found corrupt when the replica is reopened) after the read point was committed. The
    scan then falls over to a follower whose log holds the read point's entry at its term,
    through ``read_table`` and the ``kudu`` data source alike, instead of failing the read
    (a CI run of the fault harness failed exactly so)."""
    from pyspark_kudu.spark.api.datasource import KuduReader
    from pyspark_kudu.spark.api.source_options import parse_read_options
    from pyspark_kudu.spark.replication.session_client import SessionClient

    kudu.create_table("linf", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    rows = [(i, f"v{i}") for i in range(20)]
    kudu.upsert_rows(spark.createDataFrame(rows, STRUCT), "linf")
    roots = {s.uuid: s.root for s in kudu.servers}
    tablets = [t.tablet_id for t in kudu.master.get_table("linf").tablets]

    def fail_leader_replicas() -> None:
        for tid in tablets:
            root = roots[kudu._leaders[tid].leader_id]
            assert root is not None
            mark_failed(tablet_dir(root, tid), "test: the leader replica's WAL is corrupt")

    planned = kudu.read_table("linf", read_mode="linearizable")  # commits the read points
    address = kudu.session_service.address
    reader = KuduReader(SessionClient(address).describe("linf"), parse_read_options(
        {"kudu.table": "linf", "kudu.readMode": "linearizable"}), STRUCT, address)
    parts = reader.partitions()  # the data source's read points
    fail_leader_replicas()
    assert sorted((r["id"], r["v"]) for r in planned.collect()) == rows
    got = [row for p in parts for batch in reader.read(p) for row in
           zip(*(batch.column(n).to_pylist() for n in ("id", "v")), strict=True)]
    assert sorted(got) == rows


def test_rounds_are_served_by_the_hosts_resident_tablet_server(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    """A round's Spark task hands its requests to the host's resident tablet server, so the
    replicas stay open in one long-lived process instead of whichever worker ran the task."""
    from pyspark_kudu.spark.host.tserver_client import ping

    addresses = {s.address for s in kudu.servers if s.address}
    assert len(addresses) == 1, f"local mode has one host and one server: {addresses}"
    (address,) = addresses
    secret = kudu.credential.encode()
    before = ping(address, secret)["rounds_served"]
    kudu.create_table("served", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    kudu.upsert_rows(spark.createDataFrame([(i, "v") for i in range(20)], STRUCT), "served")
    after = ping(address, secret)
    assert after["rounds_served"] > before, after
    assert sorted(r["id"] for r in kudu.read_table("served").collect()) == list(range(20))


def test_a_scan_whose_token_names_stale_server_addresses_asks_for_fresh_ones(
    spark: SparkSession, kudu: KuduContext, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replaced executor's resident tablet server listens on a new port, so a scan token
    planned before names an address nobody answers at: the scan fails with every reason
    unless it may ask the planning side for the current addresses, then it reads it all."""
    from dataclasses import replace

    from pyspark_kudu.errors import ServiceUnavailableError
    from pyspark_kudu.rpc.auth import SECRET_ENV
    from pyspark_kudu.spark.host.replica_reader import read_tablet_refreshing
    from pyspark_kudu.spark.replication.session_client import SessionClient

    monkeypatch.setenv(SECRET_ENV, kudu.credential)
    assert SessionClient(kudu.session_service.address).server_addresses() == {
        s.uuid: s.address for s in kudu.servers if s.address}
    kudu.create_table("stale", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    kudu.upsert_rows(spark.createDataFrame([(i, f"v{i}") for i in range(30)], STRUCT), "stale")
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    tokens = [replace(t, replicas=tuple(replace(r, address=dead) for r in t.replicas))
              for t in kudu.scan_tokens("stale")]
    with pytest.raises(ServiceUnavailableError, match="no replica served a scan"):
        list(read_tablet_refreshing(tokens[0], None))
    asked: list[int] = []
    client = SessionClient(kudu.session_service.address)

    def fresh() -> dict[str, str]:  # what the scan tasks ask the session service
        asked.append(1)
        return client.server_addresses()

    rows = sorted(r for t in tokens for b in read_tablet_refreshing(t, fresh)
                  for r in zip(b.column("id").to_pylist(), b.column("v").to_pylist(),
                               strict=True))
    assert rows == [(i, f"v{i}") for i in range(30)]
    assert len(asked) == len(tokens), f"asked for fresh addresses {len(asked)} times"


def test_reads_stay_at_this_clients_acknowledged_writes_after_its_leader_was_abandoned(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    """A failed round abandons the client's leader of a tablet (found by the chaos mode: a
    settle round failed after an executor was killed, the master's reported leader was on
    a lost host, and a read then let a follower that missed the write serve what it had).
    The read still carries the last acknowledged entry, with its term and the replica that
    committed it: read-your-writes does not depend on the leader object surviving."""
    kudu.create_table("ryw", STRUCT, keys=["id"])  # one tablet
    kudu.upsert_rows(spark.createDataFrame([(i, "a") for i in range(10)], STRUCT), "ryw")
    kudu.upsert_rows(spark.createDataFrame([(i, "b") for i in range(5)], STRUCT), "ryw")
    (t,) = kudu.master.get_table("ryw").tablets
    lead = kudu._leaders[t.tablet_id]
    assert lead.node is not None
    commit = lead.node.commit_index
    term = lead.node.log.term(commit)
    lead.abandon("test: a round of this leader failed")
    # As if no report reached the master (or its reported leader's host were lost).
    leader, known, known_term = kudu.known_commit(t.tablet_id, "", 0)
    assert (leader, known, known_term) == (lead.leader_id, commit, term), (
        "a read after the leader was abandoned would not see this client's writes")
    # A reported commit below the acknowledged one does not lower the floor either.
    assert kudu.known_commit(t.tablet_id, lead.leader_id, commit - 1)[1] == commit
    got = sorted(tuple(r) for r in kudu.read_table("ryw").collect())
    assert got == [(i, "b") for i in range(5)] + [(i, "a") for i in range(5, 10)]


def test_a_context_raises_sparks_arrow_batch_to_the_writers_unless_the_application_chose(
        spark: SparkSession, tmp_path: Path) -> None:
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    assert not spark.sparkContext.getConf().contains(key), "the test session set it"
    spark.conf.unset(key)
    before = spark.conf.get(key)
    with KuduContext(spark, warehouse=str(tmp_path / "a")):
        assert spark.conf.get(key) == "65536"
    assert spark.conf.get(key) == before, "closing the context did not restore it"
    spark.conf.set(key, "2048")  # the application's choice stays
    try:
        with KuduContext(spark, warehouse=str(tmp_path / "b")):
            assert spark.conf.get(key) == "2048"
        assert spark.conf.get(key) == "2048"
    finally:
        spark.conf.unset(key)
