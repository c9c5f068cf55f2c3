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
per package segment, and a Python list crosses as an ``ArrayList`` built one ``add`` at a
time (also when the gateway converts it): so the classes, the payloads' ``ClassTag`` and
each location list (a Scala ``Seq``) are made once per gateway (:class:`_JvmNames`), and a
round's RDD costs 2 calls per host plus 4. Under 16 concurrent writers every Py4J call
also waits for the GIL, so the count matters (:mod:`pyspark_kudu.spark.jvm`).

Thread-safety: functions here call into the driver's ``SparkContext`` (py4j is thread-safe);
their only state is the per-gateway cache of JVM names and the per-context cache of
JVM objects (each filled under a lock).
"""

from __future__ import annotations

import pickle
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pyspark import SparkContext
from pyspark.core.rdd import _wrap_function
from pyspark.rdd import RDD
from pyspark.serializers import CPickleSerializer
from pyspark.util import _load_from_socket

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.spark.jvm import context_cache, gateway_cache, scala_context

__all__ = ["barrier_collect", "executor_hosts", "parse_block_manager_ids", "pinned_rdd"]


class _JvmNames:
    """The JVM classes :func:`pinned_rdd` uses, looked up once per Py4J gateway."""

    def __init__(self, sc: SparkContext) -> None:
        jvm = sc._jvm
        assert jvm is not None
        self.tuple2 = jvm.scala.Tuple2
        self.array_list = jvm.java.util.ArrayList
        self.converters = jvm.scala.jdk.javaapi.CollectionConverters
        # Static methods: resolving one through its class is a reflection call per use.
        self.as_scala = self.converters.asScala
        self.bytes_tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
        self.python_rdd = jvm.org.apache.spark.api.python.PythonRDD
        self.collect_and_serve = self.python_rdd.collectAndServe
        params = getattr(sc._gateway, "gateway_parameters", None)
        self.auto_convert = bool(getattr(params, "auto_convert", False))
        # Location lists as Scala Seqs: a cluster has few (one per host), each used by
        # every round; bounded all the same (executor ids change as executors come back).
        self._locations: dict[tuple[str, ...], Any] = {}
        self._locations_lock = threading.Lock()

    def seq(self, items: list[Any]) -> Any:
        """A Scala ``Seq`` of ``items`` (``ArrayList`` + one ``add`` per item + 2 calls)."""
        if self.auto_convert:  # the gateway builds the ArrayList the same way
            return self.as_scala(items).toSeq()
        jl = self.array_list()
        for x in items:
            jl.add(x)
        return self.as_scala(jl).toSeq()

    def locations(self, locs: Sequence[str]) -> Any:
        """``locs`` as a Scala ``Seq[String]``, built once per distinct list."""
        key = tuple(locs)
        with self._locations_lock:
            found = self._locations.get(key)
        if found is None:
            found = self.seq(list(key))
            with self._locations_lock:
                if len(self._locations) >= _MAX_LOCATION_LISTS:
                    self._locations.clear()
                self._locations[key] = found
        return found


_MAX_LOCATION_LISTS = 1024

def _jvm_names(sc: SparkContext) -> _JvmNames:
    return gateway_cache(sc, "pinned-names", lambda: _JvmNames(sc))


def _pinned_jrdd(sc: SparkContext, names: _JvmNames,
                 payloads: Sequence[tuple[Any, Sequence[str]]]) -> Any:
    """The JVM ``RDD[Array[Byte]]`` of :func:`pinned_rdd`: ``2n + 4`` Py4J calls for ``n``
    payloads once their location lists are known."""
    if not payloads:
        raise InvalidArgumentError("pinned_rdd needs at least one (payload, locations) pair")
    pairs = [
        names.tuple2(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)),
                     names.locations(locs))
        for obj, locs in payloads
    ]
    ssc = scala_context(sc)
    return ssc.makeRDD(names.seq(pairs), names.bytes_tag)


def pinned_rdd(sc: SparkContext, payloads: Sequence[tuple[Any, Sequence[str]]]) -> RDD[Any]:
    """An RDD with one partition per ``(payload, locations)``; partition i yields payload i."""
    jrdd = _pinned_jrdd(sc, _jvm_names(sc), payloads)
    return RDD(jrdd.toJavaRDD(), sc, CPickleSerializer())


class _OnPartition:
    """``f(iterator)`` as the ``(partition index, iterator)`` function a ``PythonRDD``
    runs (what ``RDD.mapPartitions`` wraps ``f`` in)."""

    def __init__(self, f: Callable[[Iterator[Any]], Iterable[Any]]) -> None:
        self.f = f

    def __call__(self, _split: int, iterator: Iterator[Any]) -> Iterable[Any]:
        return self.f(iterator)


def barrier_collect(sc: SparkContext, payloads: Sequence[tuple[Any, Sequence[str]]],
                    f: Callable[[Iterator[Any]], Iterable[Any]]) -> list[Any]:
    """``pinned_rdd(sc, payloads).barrier().mapPartitions(f).collect()``, the job of every
    replication round, in ``2n + 10`` Py4J calls for ``n`` hosts instead of ~``6n + 30``.

    PySpark pickles ``f`` anew for every RDD and builds its JVM ``PythonFunction`` with the
    context's environment and includes converted call by call; here that function is built
    once per context, ``f`` and environment (PySpark's own builder), and each round makes
    only its ``PythonRDD`` (barrier) over the pinned RDD and collects it. With Python
    profiling on, PySpark's path is taken: its profiler is per RDD."""
    if sc.profiler_collector and sc._conf.get("spark.python.profile", "false") == "true":
        profiled: list[Any] = pinned_rdd(sc, payloads).barrier().mapPartitions(f).collect()
        return profiled
    names = _jvm_names(sc)
    jfunc = _python_function(sc, f)
    parent = _pinned_jrdd(sc, names, payloads)
    # Not preserving partitioning; from a barrier RDD (PythonRDD's last argument).
    sock_info = names.collect_and_serve(names.python_rdd(parent, jfunc, False, True))
    with _load_from_socket(sock_info, sc.serializer) as stream:
        out: list[Any] = list(stream)
    return out


_functions_lock = threading.Lock()


def _python_function(sc: SparkContext, f: Callable[[Iterator[Any]], Iterable[Any]]) -> Any:
    """The JVM ``PythonFunction`` running ``_OnPartition(f)`` over pinned payloads, made
    once per context and ``f``, again if the context's Python side changed (environment,
    included files, interpreter): what PySpark's ``_wrap_function`` puts in it."""
    made: dict[Any, tuple[Any, Any]] = context_cache(sc, "pinned-python-functions", dict)
    fingerprint = (sc.pythonExec, sc.pythonVer, tuple(sc._python_includes or ()),
                   tuple(sorted((sc.environment or {}).items())))
    with _functions_lock:
        found = made.get(f)
        if found is not None and found[0] == fingerprint:
            return found[1]
        jfunc = _wrap_function(sc, _OnPartition(f), CPickleSerializer(), sc.serializer)
        made[f] = (fingerprint, jfunc)
        return jfunc


def executor_hosts(sc: SparkContext) -> dict[str, list[str]]:
    """Live executors by host: ``{host: [executor ids]}``.

    Read from the block manager master, which knows every registered executor with its id
    and host. The driver is excluded unless it is the only executor (``local[*]`` mode).

    Every write routes with this (and the liveness reporter calls it every beat), so it
    costs two Py4J calls: the master's memory status, whose text (a Scala ``Map`` keyed by
    ``BlockManagerId``) is parsed. The master is looked up once per context (4 calls saved).
    Walking the JVM's set through Py4J took 4 calls per executor plus a Java exception
    converted at its end, 25-65 ms per call on the 6-worker test cluster. Should the text
    ever not parse (every id must match), the ids are walked instead.
    """
    ssc = scala_context(sc)
    master = context_cache(sc, "block-manager-master",
                           lambda: ssc.env().blockManager().master())
    status = master.getMemoryStatus()
    pairs = parse_block_manager_ids(str(status.toString()))
    if pairs is None:
        pairs = []
        it = _jvm_names(sc).converters.asJava(status.keySet()).iterator()
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
