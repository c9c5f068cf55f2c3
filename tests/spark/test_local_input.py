"""Driver-side rows of a write (pyspark_kudu.spark.api.local_input): a list-built or Arrow-built
DataFrame's rows are read in the driver with no Spark job, exactly as Spark would convert
them; anything else is left to the staging job (``None``)."""

from __future__ import annotations

import datetime as dt
import decimal
import io

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pyspark_kudu.spark.api.local_input import local_batches
from pyspark_kudu.spark.jvm import scala_object

ALL = StructType([
    StructField("id", LongType(), False), StructField("i", IntegerType()),
    StructField("b", ByteType()), StructField("f", FloatType()), StructField("d", DoubleType()),
    StructField("s", StringType()), StructField("bin", BinaryType()),
    StructField("ok", BooleanType()), StructField("dec", DecimalType(10, 2)),
    StructField("day", DateType()), StructField("ts", TimestampType()),
    StructField("ntz", TimestampNTZType())])


def _rows(n: int) -> list[tuple[object, ...]]:
    base = dt.datetime(2026, 10, 25, 0, 30, tzinfo=dt.timezone.utc)
    return [(i, None if i % 5 == 0 else i * 1000, i % 100, i / 4, i * 0.5, f"s{i}",
             None if i % 3 == 0 else bytes([i % 256]) * (i % 4), i % 2 == 0,
             decimal.Decimal(i) / 4, dt.date(2026, 1, 1) + dt.timedelta(days=i),
             base + dt.timedelta(minutes=29 * i), dt.datetime(2026, 3, 29, 1, 30) +
             dt.timedelta(seconds=i)) for i in range(n)]


def _jobs(spark: SparkSession, fn: object) -> int:
    sc = spark.sparkContext
    before = len(sc.statusTracker().getJobIdsForGroup(None))  # type: ignore[arg-type]
    fn()  # type: ignore[operator]
    return len(sc.statusTracker().getJobIdsForGroup(None)) - before  # type: ignore[arg-type]


def test_a_list_built_dataframe_is_read_as_spark_converts_it_without_a_job(
        spark: SparkSession) -> None:
    df = spark.createDataFrame(_rows(3000), ALL)
    got: list[pa.RecordBatch] | None = []
    assert _jobs(spark, lambda: got.extend(local_batches(df, 1 << 30) or [None])) == 0
    assert got and None not in got
    # What Spark's own conversion gives (a job, run here only to compare).
    want = df.toArrow()
    table = pa.Table.from_batches(got)
    assert table.schema.names == want.schema.names
    for name in want.schema.names:
        assert table.column(name).to_pylist() == want.column(name).to_pylist(), name


@pytest.mark.parametrize("build", ["list", "arrow"])
def test_rows_beyond_the_budget_are_left_to_the_job(spark: SparkSession, build: str) -> None:
    rows = [(i, f"value-{i:08d}") for i in range(5000)]
    schema = StructType([StructField("id", LongType(), False), StructField("v", StringType())])
    df = (spark.createDataFrame(rows, schema) if build == "list" else
          spark.createDataFrame(pa.table({"id": pa.array([r[0] for r in rows], pa.int64()),
                                           "v": [r[1] for r in rows]})))
    assert local_batches(df, 10_000) is None
    batches = local_batches(df, 1 << 30)
    assert batches is not None
    assert sum(b.num_rows for b in batches) == 5000


def test_transformed_or_mapped_dataframes_are_left_to_the_job(spark: SparkSession) -> None:
    schema = StructType([StructField("id", LongType(), False)])
    base = spark.createDataFrame([(i,) for i in range(10)], schema)
    assert local_batches(base.where("id > 3"), 1 << 30) is None
    assert local_batches(base.coalesce(1), 1 << 30) is None
    mapped = spark.createDataFrame(
        spark.sparkContext.parallelize([(i,) for i in range(10)]).map(lambda t: (t[0] + 1,)),
        schema)
    assert local_batches(mapped, 1 << 30) is None


@pytest.mark.parametrize("rows", [[(1.5, "a")], [(300, "a")], [(1, 2)]],
                         ids=["float-in-byte", "out-of-range", "int-in-string"])
def test_values_only_verify_schema_false_lets_in_become_what_spark_makes_of_them(
        spark: SparkSession, rows: list[tuple[object, ...]]) -> None:
    """Spark turns 1.5 in a ByteType column into 0 and 300 into 44 (and 2 in a string column
    into "2"): whatever the driver reads must be exactly that, or be left to the job."""
    schema = StructType([StructField("id", ByteType(), False), StructField("v", StringType())])
    df = spark.createDataFrame(rows, schema, verifySchema=False)
    got = local_batches(df, 1 << 30)
    if got is not None:
        assert pa.Table.from_batches(got).to_pylist() == df.toArrow().to_pylist()
    if isinstance(rows[0][0], float) or rows[0][0] == 300:
        assert got is None, "a value Spark converts its own way was read in the driver"


class _WithoutDataField:
    """A ``ParallelCollectionRDD`` as another Spark's might look: its class has no ``data``
    field (every other call goes to the real JVM object)."""

    def __init__(self, rdd: object) -> None:
        self._rdd = rdd

    def getClass(self) -> object:
        return self._rdd.getClass().getSuperclass()  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._rdd, name)


@pytest.mark.parametrize("rows", [1, 3, 1000])
def test_the_collection_is_read_alike_through_py4j_one_socket_or_a_socket_per_partition(
        spark: SparkSession, rows: int) -> None:
    from pyspark_kudu.spark.api import local_input

    sc = spark.sparkContext
    rdd = sc.parallelize([(i, str(i)) for i in range(rows)], 7)._jrdd.rdd()
    assert rdd.getClass().getSimpleName() == "ParallelCollectionRDD"
    want = [bytes(b) for p in rdd.collectPartitions() for b in p]  # type: ignore[attr-defined]
    assert want

    def read(source: object, direct_max: int) -> list[bytes]:
        out = io.BytesIO()
        assert local_input._read_collection(source, sc._jvm, out, 1 << 30, direct_max) >= 0
        out.seek(0)
        got = []
        while head := out.read(4):
            got.append(out.read(int.from_bytes(head, "big")))
        return got

    assert read(rdd, direct_max=10_000) == want  # each record through Py4J
    assert read(rdd, direct_max=0) == want  # the whole collection over one socket
    assert read(_WithoutDataField(rdd), direct_max=10_000) == want  # a socket per partition
    # The budget stops either way: the bytes of all but the last record are not enough.
    short = sum(map(len, want)) - 1
    for direct_max in (0, 10_000):
        assert local_input._read_collection(rdd, sc._jvm, io.BytesIO(), short, direct_max) < 0


def test_a_values_relation_whose_analyzed_plan_is_aliased_is_read_from_its_optimized_plan(
        spark: SparkSession) -> None:
    """``createDataFrame``'s plans are read as analyzed (no optimizer run); a plan that is a
    local relation only once optimized (``VALUES ... AS t``: an alias over it) still is."""
    df = spark.sql("SELECT * FROM VALUES (1L, 'a'), (2L, 'b') AS t(id, v)")
    assert df._jdf.queryExecution().analyzed().getClass().getSimpleName() != "LocalRelation"
    got: list[pa.RecordBatch] | None = []
    assert _jobs(spark, lambda: got.extend(local_batches(df, 1 << 30) or [None])) == 0
    assert got and None not in got
    assert pa.Table.from_batches(got).to_pylist() == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]


def test_a_lineage_of_the_same_classes_in_another_shape_is_left_to_the_job(
        spark: SparkSession) -> None:
    """A union of two parallelized collections under the same maps: every RDD is of a class
    the lineage has, but the shape is not ``createDataFrame(list)``'s."""
    schema = StructType([StructField("id", LongType(), False)])
    sc = spark.sparkContext
    union = sc.parallelize([(1,)]).union(sc.parallelize([(2,)]))
    df = spark.createDataFrame(union, schema)
    assert "UnionRDD" in df._jdf.queryExecution().analyzed().rdd().toDebugString()
    assert local_batches(df, 1 << 30) is None
    assert sorted(r["id"] for r in df.collect()) == [1, 2]  # the job still reads it


def test_each_pickled_function_keeps_its_own_answer(spark: SparkSession) -> None:
    """The verdict on a ``PythonRDD``'s function is kept per pickled command: a mapped
    lineage stays refused after a list-built one was read, and the other way round."""
    schema = StructType([StructField("id", LongType(), False)])
    sc = spark.sparkContext

    def mapped() -> object:
        return spark.createDataFrame(
            sc.parallelize([(i,) for i in range(3)]).map(lambda t: (t[0] * 10,)), schema)

    for _ in range(2):
        assert local_batches(mapped(), 1 << 30) is None  # type: ignore[arg-type]
        got = local_batches(spark.createDataFrame([(7,), (8,)], schema), 1 << 30)
        assert got is not None and pa.Table.from_batches(got).column("id").to_pylist() == [7, 8]


def test_a_field_looked_up_for_one_class_is_refused_by_another(spark: SparkSession) -> None:
    """Fields are looked up once per gateway from an object of their class: an object of
    another class gets none then, and a cached field read from one fails in Py4J (the caller
    then takes the job), so the collection falls back to reading each partition, and a
    write whose function field were the wrong one would take the job."""
    from pyspark_kudu.spark.api import local_input

    sc = spark.sparkContext
    source = sc.parallelize([(i, str(i)) for i in range(5)], 2)._jrdd.rdd()
    python_rdd = sc.parallelize([1]).map(lambda x: x)._jrdd.rdd()
    from pyspark_kudu.spark import jvm

    jvm._by_gateway.clear()  # as in a fresh driver: nothing looked up yet
    assert local_input._declared_field(sc, python_rdd, local_input._COLLECTION_RDD,
                                       "data") is None
    func = local_input._declared_field(sc, python_rdd, local_input._PYTHON_RDD, "func")
    data = local_input._declared_field(sc, source, local_input._COLLECTION_RDD, "data")
    assert func is not None and data is not None
    with pytest.raises(local_input._JVM_ERRORS):
        func.get(source)
    want = io.BytesIO()
    assert local_input._read_collection(source, sc._jvm, want, 1 << 30, data_field=data) >= 0
    other = io.BytesIO()
    assert local_input._read_collection(source, sc._jvm, other, 1 << 30, data_field=func) >= 0
    assert other.getvalue() == want.getvalue() and want.getvalue()


def test_an_arrow_built_dataframe_is_converted_by_spark_without_collecting_it(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``LocalRelation``'s rows go through Spark's own Arrow conversion in the driver JVM
    (no ``collect()``: it would run a SQL execution per write), with every type and null
    exactly as Spark converts them."""
    source = spark.createDataFrame(_rows(500), ALL).toArrow()  # a job, only to build it
    df = spark.createDataFrame(source)
    assert df._jdf.queryExecution().analyzed().nodeName() == "LocalRelation"
    want = df.toArrow()

    def no_collect(self: object) -> None:
        raise AssertionError("collect() was called")

    monkeypatch.setattr(type(df), "collect", no_collect)
    got: list[pa.RecordBatch] | None = []
    assert _jobs(spark, lambda: got.extend(local_batches(df, 1 << 30) or [None])) == 0
    assert got and None not in got
    assert pa.Table.from_batches(got).equals(want)


def test_without_the_converter_an_arrow_built_dataframe_is_collected(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Spark's converter (missing, or giving other Arrow types) is not used: the
    rows are collected instead, with the same result."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from pyspark_kudu.spark.api import local_input

    df = spark.createDataFrame(spark.createDataFrame(_rows(50), ALL).toArrow())
    want = local_batches(df, 1 << 30)
    assert want is not None
    sc = spark.sparkContext
    plan = df._jdf.queryExecution().analyzed()
    other = to_arrow_schema(df.schema, timezone="America/New_York")
    assert local_input._relation_batches(sc, plan, other) is None  # other timestamp types
    assert scala_object(sc, "org.example.NoSuchObject$") is None
    assert scala_object(sc, local_input._ARROW_CONVERTERS) is not None
    monkeypatch.setattr(local_input, "scala_object", lambda sc, name: None)  # another Spark
    collected = 0
    collect = type(df).collect

    def counted(self: object) -> object:
        nonlocal collected
        collected += 1
        return collect(self)  # type: ignore[arg-type]

    monkeypatch.setattr(type(df), "collect", counted)
    got = local_batches(df, 1 << 30)
    assert collected == 1 and got is not None
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(want))


@pytest.mark.parametrize("build", ["list", "arrow"])
def test_a_small_dataframe_costs_a_bounded_number_of_py4j_calls(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch, build: str) -> None:
    """Py4J calls from many writer threads queue for the driver JVM (~45 ms for a 1-row
    write under 16 writers when it made 43), so reading a small list-built or Arrow-built
    DataFrame makes a fixed, small number of them, whatever its lineage's length."""
    import py4j.clientserver

    schema = StructType([StructField("id", LongType(), False), StructField("v", StringType())])
    frames = [spark.createDataFrame([(i, f"v{i}")], schema) if build == "list" else
              spark.createDataFrame(pa.table({"id": pa.array([i], pa.int64()),
                                              "v": [f"v{i}"]})) for i in range(4)]
    frames[0].schema  # noqa: B018 (PySpark caches a DataFrame's schema on first use)
    assert local_batches(frames[0], 1 << 20) is not None  # fields and answers looked up
    calls = 0
    send = py4j.clientserver.ClientServerConnection.send_command

    def counted(self: object, command: str) -> str:
        nonlocal calls
        calls += 1
        return send(self, command)  # type: ignore[arg-type]

    for df in frames[1:]:
        df.schema  # noqa: B018
        monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command", counted)
        got = local_batches(df, 1 << 20)
        monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command", send)
        assert got is not None and pa.Table.from_batches(got).num_rows == 1
    assert calls / 3 <= 16, f"{calls / 3:.1f} Py4J calls per 1-row DataFrame"
