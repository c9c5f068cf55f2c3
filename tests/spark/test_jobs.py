"""The spark-submit jobs in ``jobs/``, run in-process on the shared local session (and
``ingest.py`` once through ``spark-submit``): what they write, print and exit with."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pyspark_kudu import HashDimension, KuduContext, PartitionSchema

JOBS = Path(__file__).resolve().parents[2] / "jobs"
Row = tuple[int, str, float | None]


@functools.cache
def job(name: str) -> ModuleType:
    """``jobs/<name>.py`` as a module (jobs are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"jobs_{name}", JOBS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows(ids: range) -> list[Row]:
    return [(i, f"name-{i}", i * 0.5 if i % 5 else None) for i in ids]


def write_source(fmt: str, data: list[Row], path: Path) -> None:
    """``data`` as a ``fmt`` source at ``path``, written without Spark."""
    table = pa.table({"id": [r[0] for r in data], "name": [r[1] for r in data],
                      "score": [r[2] for r in data]})
    if fmt == "csv":
        path.write_text("id,name,score\n" + "".join(
            f"{i},{n},{'' if s is None else s}\n" for i, n, s in data))
    elif fmt == "json":
        path.write_text("".join(json.dumps({"id": i, "name": n, "score": s}) + "\n"
                                for i, n, s in data))
    elif fmt == "parquet":
        pq.write_table(table, path)
    else:
        write_deltalake(str(path), table)


def spark_types(fmt: str) -> StructType:
    """The schema Spark reads the source as: csv infers int for small integers."""
    id_type: DataType = IntegerType() if fmt == "csv" else LongType()
    return StructType([StructField("id", id_type), StructField("name", StringType()),
                       StructField("score", DoubleType())])


def argv(*parts: str | Path) -> list[str]:
    return [str(a) for a in parts]


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "wh")


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet", "delta"])
def test_ingest_creates_the_table_and_writes_every_source_row(
    spark: SparkSession, tmp_path: Path, warehouse: str, fmt: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = rows(range(30))
    src = tmp_path / f"src.{fmt}"
    write_source(fmt, data, src)
    code = job("ingest").main(argv("--source", src, "--format", fmt, "--table", "t",
                                     "--create", "--keys", "id", "--hash-buckets", "2",
                                     "--warehouse", warehouse), spark)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "rows written:    30" in out and "row errors:      0" in out
    with KuduContext(spark, warehouse=warehouse) as kudu:
        assert [f.name for f in kudu.master.get_table("t").table.schema.columns] == [
            "id", "name", "score"]
        back = kudu.read_table("t")
        assert_df_equality(back, spark.createDataFrame(data, spark_types(fmt)),
                           ignore_row_order=True, ignore_nullable=True, ignore_metadata=True)


def test_ingest_with_a_location_mapping_command_places_its_tablet_servers(
    spark: SparkSession, tmp_path: Path, warehouse: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """The embedded master (the default) gets locations from ``--location-mapping-cmd``."""
    script = tmp_path / "map.sh"
    script.write_text("#!/bin/sh\necho /dc1/rack7\n")
    script.chmod(0o700)
    src = tmp_path / "src.csv"
    write_source("csv", rows(range(10)), src)
    code = job("ingest").main(argv("--source", src, "--format", "csv", "--table", "racked",
                                     "--create", "--keys", "id", "--hash-buckets", "2",
                                     "--replicas", "1", "--warehouse", warehouse,
                                     "--location-mapping-cmd", script), spark)
    assert code == 0, capsys.readouterr().out
    with KuduContext(spark, warehouse=warehouse) as kudu:
        locations = {t["location"] for t in kudu.master.list_tservers()}
    assert locations == {"/dc1/rack7"}


def test_ingest_insert_of_existing_keys_reports_row_errors_writes_the_rest_and_exits_1(
    spark: SparkSession, tmp_path: Path, warehouse: str, capsys: pytest.CaptureFixture[str],
) -> None:
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    write_source("csv", rows(range(20)), first)
    write_source("csv", rows(range(15, 25)), second)
    assert job("ingest").main(argv("--source", first, "--format", "csv", "--table", "t",
                                     "--create", "--keys", "id", "--warehouse", warehouse,
                                     "--ksck"), spark) == 0
    out = capsys.readouterr().out
    assert "Summary by table" in out and out.rstrip().endswith("OK")  # the ksck report
    code = job("ingest").main(argv("--source", second, "--format", "csv", "--table", "t",
                                     "--operation", "insert", "--warehouse", warehouse), spark)
    out = capsys.readouterr().out
    assert code == 1, out
    assert "rows written:    5" in out and "row errors:      5; sample:" in out
    assert sorted(int(i) for i in re.findall(r"AlreadyPresent \{'id': (\d+)\}", out)) == [
        15, 16, 17, 18, 19]
    with KuduContext(spark, warehouse=warehouse) as kudu:
        assert sorted(r["id"] for r in kudu.read_table("t", columns=["id"]).collect()) == list(
            range(25))


@pytest.mark.parametrize(("keys", "named"), [("id,region", "['region']"), ("score", "score")])
def test_ingest_refuses_a_missing_or_null_key_column_and_creates_no_table(
    spark: SparkSession, tmp_path: Path, warehouse: str, keys: str, named: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = tmp_path / "src.parquet"
    write_source("parquet", rows(range(10)), src)  # score is null for ids 0 and 5
    code = job("ingest").main(argv("--source", src, "--format", "parquet", "--table", "t",
                                     "--create", "--keys", keys, "--warehouse", warehouse),
                              spark)
    err = capsys.readouterr().err
    assert code == 2
    assert "ingest.py: error: key column(s)" in err and named in err, err
    with KuduContext(spark, warehouse=warehouse) as kudu:
        assert not kudu.table_exists("t")


def test_ingest_through_spark_submit_prints_the_summary(tmp_path: Path) -> None:
    src = tmp_path / "src.csv"
    write_source("csv", rows(range(25)), src)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_DIRS=str(tmp_path / "spark-local"))
    # The README's demo runs exactly this command (jobs/demo.py part 3).
    proc = subprocess.run(
        job("demo").ingest_command(str(src), str(tmp_path / "wh"), table="t"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Tablet Server Summary" in proc.stdout and "HEALTHY" in proc.stdout
    assert "created table t: key (id), 3 hash buckets, 3 replicas" in proc.stdout
    assert "rows written:    25" in proc.stdout and "row errors:      0" in proc.stdout
    # spark-submit merges the Python driver's stderr (the progress line) into stdout.
    assert "ingest: 25/25 rows" in proc.stdout
    # conf/log4j2.properties: the job's lines, not Spark's INFO log.
    chatter = [line for line in (proc.stdout + proc.stderr).splitlines() if " INFO " in line]
    assert chatter == [], chatter[:5]


@pytest.fixture
def one_table(spark: SparkSession, warehouse: str) -> Iterator[list[Row]]:
    """A warehouse holding table ``events`` (RF=3, 3 tablets) with 40 rows; yields them."""
    data = rows(range(40))
    struct = StructType([StructField("id", LongType(), False),
                         StructField("name", StringType()), StructField("score", DoubleType())])
    with KuduContext(spark, warehouse=warehouse) as kudu:
        kudu.create_table("events", struct, keys=["id"], replicas=3,
                          partitioning=PartitionSchema((HashDimension(("id",), 3),)))
        kudu.insert_rows(spark.createDataFrame(data, struct), "events")
    yield data


def test_export_delta_writes_every_row_and_mode_error_refuses_an_existing_table(
    spark: SparkSession, tmp_path: Path, warehouse: str, one_table: list[Row],
    capsys: pytest.CaptureFixture[str],
) -> None:
    dest = str(tmp_path / "delta")
    args = ["--table", "events", "--dest", dest, "--warehouse", warehouse]
    assert job("export_delta").main(args, spark) == 0
    assert f"exported 40 rows of table events to {dest} (Delta version 0" in (
        capsys.readouterr().out)
    # DESIGN §4: read the files, never DeltaTable.to_pyarrow_table().
    back = pa.concat_tables(pq.read_table(f) for f in DeltaTable(dest).file_uris())
    assert sorted(zip(*back.to_pydict().values(), strict=True)) == one_table
    assert job("export_delta").main([*args, "--mode", "error"], spark) == 1
    assert "already exists" in capsys.readouterr().err
    assert DeltaTable(dest).version() == 0


def test_ksck_on_a_fresh_warehouse_reports_the_table_healthy_and_exits_0(
    spark: SparkSession, warehouse: str, one_table: list[Row],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert job("ksck").main(["--warehouse", warehouse, "--format", "json"], spark) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["placement_policy_violations"] == []
    assert [(t["Name"], t["Status"], t["Healthy"]) for t in report["tables"]] == [
        ("events", "HEALTHY", 3)]
    assert len(report["tservers"]) == 3


def test_rebalance_reports_a_balanced_plan_and_executing_it_moves_nothing(
    spark: SparkSession, warehouse: str, one_table: list[Row],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert job("rebalance").main(["--warehouse", warehouse], spark) == 0
    assert "Planned moves: 0" in capsys.readouterr().out
    assert job("rebalance").main(["--no-report_only", "--warehouse", warehouse], spark) == 0
    out = capsys.readouterr().out
    assert "executed 0 of 0 moves" in out and "Planned moves: 0" in out


def test_tablet_copy_moves_a_replica_and_heal_finds_nothing_left_then_sweeps_it(
    spark: SparkSession, warehouse: str, one_table: list[Row],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with KuduContext(spark, warehouse=warehouse, local_tablet_servers=4, heal=False) as kudu:
        tablet = kudu.master.get_table("events").tablets[0]
        src = next(v for v in tablet.voters if v != tablet.leader)
        dst = next(s.uuid for s in kudu.servers if tablet.replica(s.uuid) is None)
    base = ["--warehouse", warehouse, "--local-tablet-servers", "4"]
    assert job("tablet_copy").main(["--table", "events", "--tablet", tablet.tablet_id,
                                    "--from", src, "--to", dst, *base], spark) == 0
    assert f"from {src} to {dst}" in capsys.readouterr().out
    assert job("tablet_copy").main(["--table", "events", "--tablet", tablet.tablet_id,
                                    "--from", src, "--to", dst, *base], spark) == 2
    assert "has no voter on" in capsys.readouterr().err
    assert job("heal").main([*base, "--format", "json"], spark) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["quiet"] is True and report["actions"] == [] and report["swept"] == 1
    with KuduContext(spark, warehouse=warehouse, local_tablet_servers=4, heal=False) as kudu:
        got = sorted(tuple(r) for r in kudu.read_table("events").collect())
    assert [g[0] for g in got] == [r[0] for r in one_table]


def test_recover_refuses_without_the_data_loss_flag_and_while_a_majority_lives(
    spark: SparkSession, warehouse: str, one_table: list[Row],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with KuduContext(spark, warehouse=warehouse, heal=False) as kudu:
        tablet = kudu.master.get_table("events").tablets[0]
    args = ["--table", "events", "--tablet", tablet.tablet_id, "--warehouse", warehouse]
    assert job("recover").main(args, spark) == 2
    assert "--i-understand-data-loss" in capsys.readouterr().err
    assert job("recover").main([*args, "--i-understand-data-loss"], spark) == 2
    assert "does not need an unsafe recovery" in capsys.readouterr().err
