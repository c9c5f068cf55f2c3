"""Pinned RDDs and the instance-file check in local mode (virtual tablet servers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark import BarrierTaskContext
from pyspark.sql import SparkSession

from pyspark_kudu.spark import pinned
from pyspark_kudu.spark.host.identity import ensure_instance, run_pinned
from pyspark_kudu.spark.pinned import (
    barrier_collect,
    executor_hosts,
    parse_block_manager_ids,
    pinned_rdd,
)


@pytest.mark.parametrize("auto_convert", [True, False], ids=["lists-converted", "lists-built"])
def test_pinned_rdd_has_one_partition_per_payload_with_its_locations(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch, auto_convert: bool) -> None:
    sc = spark.sparkContext
    names = pinned._JvmNames(sc)
    assert names.auto_convert, "PySpark's gateway converts Python lists"
    names.auto_convert = auto_convert  # a gateway that does not: lists built call by call
    monkeypatch.setattr(pinned, "_jvm_names", lambda sc: names)
    rdd = pinned_rdd(sc, [({"n": 1}, ["ts-a"]), ({"n": 2}, ["ts-b", "ts-c"])])
    assert rdd.getNumPartitions() == 2
    jrdd = rdd._jrdd.rdd()
    prefs = [list(sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(jrdd.preferredLocations(p)))
             for p in jrdd.partitions()]
    assert prefs == [["ts-a"], ["ts-b", "ts-c"]]
    assert rdd.map(lambda d: d["n"] * 10).collect() == [10, 20]
    assert rdd.barrier().mapPartitions(lambda it: [d["n"] for d in it]).collect() == [1, 2]


def test_local_mode_reports_the_driver_as_the_only_executor_host(spark: SparkSession) -> None:
    hosts = executor_hosts(spark.sparkContext)
    assert len(hosts) == 1
    assert next(iter(hosts.values())) == ["driver"]
    # The one-call path read it: the JVM's text of the memory status (a Map) parses.
    status = spark.sparkContext._jsc.sc().env().blockManager().master().getMemoryStatus()
    text = str(status.toString())
    assert parse_block_manager_ids(text) == [("driver", next(iter(hosts)))], text
    # Text that does not parse: the ids are walked one by one, to the same answer.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pinned, "parse_block_manager_ids", lambda _text: None)
        assert executor_hosts(spark.sparkContext) == hosts


def _tasks_of(it: Iterator[dict[str, int]]) -> Iterator[tuple[int, int, int, int]]:
    """A barrier task's payloads with its partition, the barrier's size, and its stage."""
    ctx = BarrierTaskContext.get()  # raises outside a barrier stage
    ctx.barrier()  # all tasks at once: a barrier stage's tasks are launched together
    for d in it:
        yield d["n"], ctx.partitionId(), len(ctx.getTaskInfos()), ctx.stageId()


def test_barrier_collect_runs_one_barrier_stage_like_pysparks_path(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rounds' own path to a pinned barrier stage gives what PySpark's
    ``barrier().mapPartitions(f).collect()`` gives, builds ``f``'s JVM function once per
    context and environment, and costs 2 Py4J calls per host plus 10."""
    import py4j.clientserver

    sc = spark.sparkContext
    payloads = [({"n": i}, [f"ts-{i}"]) for i in range(2)]  # local[2]: two task slots
    public = pinned_rdd(sc, payloads).barrier().mapPartitions(_tasks_of).collect()
    got = barrier_collect(sc, payloads, _tasks_of)
    assert [r[:3] for r in got] == [r[:3] for r in public] == [(i, i, 2) for i in range(2)]
    assert len({r[3] for r in got}) == 1 and got[0][3] != public[0][3]  # its own stage
    made: list[object] = []
    wrap = pinned._wrap_function

    def counted_wrap(*args: object) -> object:
        made.append(args[1])
        return wrap(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(pinned, "_wrap_function", counted_wrap)
    calls = 0
    send = py4j.clientserver.ClientServerConnection.send_command

    def counted(self: object, command: str) -> str:
        nonlocal calls
        # Not the finalizer's commands for objects Python dropped meanwhile, whoever's.
        calls += not command.startswith("m\nd\n")
        return send(self, command)  # type: ignore[arg-type]

    monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command", counted)
    again = barrier_collect(sc, payloads, _tasks_of)
    monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command", send)
    assert [r[:3] for r in again] == [(i, i, 2) for i in range(2)]
    assert made == [], "the function was built again for the same context and environment"
    assert calls <= 2 * len(payloads) + 10, f"{calls} Py4J calls for 2 hosts"
    monkeypatch.setitem(sc.environment, "KUDU_TEST_MARK", "1")  # the Python side changed
    assert [r[:3] for r in barrier_collect(sc, payloads, _tasks_of)] == [
        (i, i, 2) for i in range(2)]
    assert len(made) == 1, "a changed environment must build the function again"
    with pytest.raises(Exception, match="ZeroDivisionError"):
        barrier_collect(sc, payloads, lambda it: [1 // 0 for _ in it])


def test_block_manager_ids_parse_only_when_every_one_does() -> None:
    text = ("[BlockManagerId(3, 127.0.0.4, 40213, None), BlockManagerId(driver, 127.0.0.1, "
            "38001, None), BlockManagerId(12, host-7.example, 41000, Some(/dc1/rack2))]")
    assert parse_block_manager_ids(text) == [
        ("3", "127.0.0.4"), ("driver", "127.0.0.1"), ("12", "host-7.example")]
    assert parse_block_manager_ids("[]") == []
    # A shape this parser does not know (here: no port): the caller walks the ids instead.
    assert parse_block_manager_ids("[BlockManagerId(3, 127.0.0.4)]") is None


def test_virtual_tablet_servers_refuse_work_aimed_at_another_server(
    spark: SparkSession, tmp_path: Path
) -> None:
    roots = [str(tmp_path / f"ts{i}") for i in range(3)]
    uuids = [ensure_instance(r).uuid for r in roots]
    assert len(set(uuids)) == 3
    payloads = [((roots[i], uuids[(i + 1) % 3]), [f"vhost-{i}"]) for i in range(3)]
    payloads.append(((roots[0], uuids[0]), ["vhost-0"]))
    results = pinned_rdd(spark.sparkContext, payloads).map(
        lambda p: run_pinned(p[0], p[1], lambda root: root)
    ).collect()
    assert [r.ok for r in results] == [False, False, False, True]
    assert results[3].value == roots[0]
    assert "belongs to tablet server" in results[0].misplaced_reason
