"""RDDs whose partitions are pinned to chosen hosts, for normal and barrier stages.

Spark has no public Python API for per-partition preferred locations, but the JVM has
``SparkContext.makeRDD(Seq[(T, Seq[String])])``: one partition per element, each with its
own location list. We build that RDD over pickled payloads through py4j and wrap it as a
Python RDD whose only element per partition is the payload (DESIGN §4: 30/30 trials placed
every task exactly, also in barrier mode).

A location string is a host (``127.0.0.3``) or an executor (``executor_<host>_<execId>``).
A preference is only a preference: a task aimed at a host with no executor runs elsewhere
after ``spark.locality.wait``. Hence every pinned task checks the tablet server's instance
file before touching data (see :mod:`pyspark_kudu.spark.host.identity`).

Every name looked up through ``sc._jvm`` (``jvm.scala.Tuple2``) is one Py4J reflection call
per package segment; the classes and the payloads' ``ClassTag`` are looked up once per
gateway (:class:`_JvmNames`), and lists cross as one auto-converted argument where the
gateway converts them (PySpark's does): a round's RDD costs ~3 calls per host instead of ~9.
Under 16 concurrent writers every Py4J call also waits for the GIL, so the count matters.

Thread-safety: functions here call into the driver's ``SparkContext`` (py4j is thread-safe);
their only state is the per-gateway cache of JVM names (filled under a lock).
"""

from __future__ import annotations

import pickle
import re
import threading
from collections.abc import Sequence
from typing import Any

from pyspark import SparkContext
from pyspark.rdd import RDD
from pyspark.serializers import CPickleSerializer

from pyspark_kudu.errors import InvalidArgumentError

__all__ = ["executor_hosts", "parse_block_manager_ids", "pinned_rdd"]


class _JvmNames:
    """The JVM classes :func:`pinned_rdd` uses, looked up once per Py4J gateway."""

    def __init__(self, sc: SparkContext) -> None:
        jvm = sc._jvm
        assert jvm is not None
        self.tuple2 = jvm.scala.Tuple2
        self.array_list = jvm.java.util.ArrayList
        self.converters = jvm.scala.jdk.javaapi.CollectionConverters
        self.bytes_tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
        params = getattr(sc._gateway, "gateway_parameters", None)
        self.auto_convert = bool(getattr(params, "auto_convert", False))

    def seq(self, items: list[Any]) -> Any:
        """A Scala ``Seq`` of ``items`` (one call with an auto-converting gateway)."""
        if self.auto_convert:
            return self.converters.asScala(items).toSeq()
        jl = self.array_list()
        for x in items:
            jl.add(x)
        return self.converters.asScala(jl).toSeq()


# Per gateway (kept referenced, so that its id cannot be reused by another one).
_names: dict[int, tuple[Any, _JvmNames]] = {}
_names_lock = threading.Lock()


def _jvm_names(sc: SparkContext) -> _JvmNames:
    gateway = sc._gateway
    with _names_lock:
        entry = _names.get(id(gateway))
        if entry is None or entry[0] is not gateway:
            entry = _names[id(gateway)] = (gateway, _JvmNames(sc))
        return entry[1]


def pinned_rdd(sc: SparkContext, payloads: Sequence[tuple[Any, Sequence[str]]]) -> RDD[Any]:
    """An RDD with one partition per ``(payload, locations)``; partition i yields payload i."""
    if not payloads:
        raise InvalidArgumentError("pinned_rdd needs at least one (payload, locations) pair")
    names = _jvm_names(sc)
    pairs = [
        names.tuple2(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)),
                     names.seq(list(locs)))
        for obj, locs in payloads
    ]
    jrdd = sc._jsc.sc().makeRDD(names.seq(pairs), names.bytes_tag)
    return RDD(jrdd.toJavaRDD(), sc, CPickleSerializer())


def executor_hosts(sc: SparkContext) -> dict[str, list[str]]:
    """Live executors by host: ``{host: [executor ids]}``.

    Read from the block manager master, which knows every registered executor with its id
    and host. The driver is excluded unless it is the only executor (``local[*]`` mode).

    Every write routes with this (and the liveness reporter calls it every beat), so it
    costs one Py4J call: the block manager ids' text, parsed. Walking the JVM's set
    through Py4J took 4 calls per executor plus a Java exception converted at its end,
    25-65 ms per call on the 6-worker test cluster. Should the text ever not parse (every
    id must match), the ids are walked instead. The converter class is the per-gateway one
    (:class:`_JvmNames`): resolving ``jvm.scala.jdk.javaapi...`` anew cost four lookups, three
    of them a scan of the driver's whole classpath for a class named like the package.
    """
    jsc = sc._jsc.sc()
    status = jsc.env().blockManager().master().getMemoryStatus()
    ids = _jvm_names(sc).converters.asJava(status.keySet())
    pairs = parse_block_manager_ids(str(ids.toString()))
    if pairs is None:
        pairs = []
        it = ids.iterator()
        while it.hasNext():  # (not Python iteration: its end is a converted Java exception)
            bm_id = it.next()
            pairs.append((str(bm_id.executorId()), str(bm_id.host())))
    by_host: dict[str, list[str]] = {}
    driver: dict[str, list[str]] = {}
    for eid, host in pairs:
        target = driver if eid == "driver" else by_host
        target.setdefault(host, []).append(eid)
    for eids in by_host.values():
        eids.sort()
    return by_host or driver


_BLOCK_MANAGER_ID = re.compile(r"BlockManagerId\(([^,()\s]+), ([^,()\s]+), \d+, ")


def parse_block_manager_ids(text: str) -> list[tuple[str, str]] | None:
    """``(executor id, host)`` of each ``BlockManagerId(id, host, port, topology)`` in a
    Java collection's text, or ``None`` unless every one of them parses."""
    found = [(m.group(1), m.group(2)) for m in _BLOCK_MANAGER_ID.finditer(text)]
    return found if len(found) == text.count("BlockManagerId(") else None
