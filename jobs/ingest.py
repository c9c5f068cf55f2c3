"""Load a CSV, JSON, Parquet or Delta source into a pyspark-kudu table.

    spark-submit jobs/ingest.py --source data.csv --format csv --table events \\
        --create --keys id --hash-buckets 4 --replicas 3 [--operation upsert] [--ksck]

Thin (STYLE 11): Spark reads the source, :class:`~pyspark_kudu.KuduContext` creates the table
if asked and writes the rows (``KuduContext.write``: committed on a majority of each tablet's
replicas), and the job prints a progress line, a summary and, with ``--ksck``, the cluster
check. Spark jobs carry descriptions so the Spark UI shows which phase runs.

Delta sources are read as the Parquet files of the table's current version
(``deltalake.DeltaTable.file_uris()``): delta-spark's jars are not reachable here (DESIGN §4).

Exit codes: 0 every row written (and, with ``--ksck``, the cluster healthy); 1 per-row errors,
a failed write or ksck issues; 2 usage error (bad option, unreadable source, no such table,
a key column missing from the source or holding nulls).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from pyspark import SparkContext
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from pyspark_kudu import HashDimension, KuduContext, PartitionSchema
from pyspark_kudu.errors import InvalidArgumentError, KuduError, RowWriteError, UsageError
from pyspark_kudu.spark.api.context import WriteProgress
from pyspark_kudu.spark.api.jobsupport import (
    add_context_args,
    job_session,
    open_context,
    parse_job_args,
)
from pyspark_kudu.tools.cli_cluster import ksck_report
from pyspark_kudu.tools.connect import RemoteSource

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
FORMATS = ("csv", "json", "parquet", "delta")
_SAMPLE_ERRORS = 5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ingest.py", description=(__doc__ or "").splitlines()[0],
        epilog="Exit codes: 0 ok, 1 row errors / failed write / ksck issues, 2 usage error.")
    p.add_argument("--source", required=True, metavar="PATH",
                   help="file, directory or URL to read (a Delta table's root for delta)")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="source format; csv is read with a header row and inferred types")
    p.add_argument("--table", required=True, metavar="NAME", help="pyspark-kudu table to write")
    p.add_argument("--create", action="store_true",
                   help="create the table from the source's schema first (needs --keys); "
                        "fails if it exists")
    p.add_argument("--keys", metavar="COL[,COL...]",
                   help="primary key columns of the new table, in key order (with --create)")
    p.add_argument("--hash-buckets", type=int, default=3, metavar="N",
                   help="hash partitions over the key columns of the new table (default 3)")
    p.add_argument("--replicas", type=int, default=3, metavar="RF",
                   help="replication factor of the new table, odd (default 3)")
    p.add_argument("--operation", choices=("insert", "upsert"), default="upsert",
                   help="Kudu write operation (default upsert, as kudu-spark); insert reports "
                        "rows whose key exists as per-row errors")
    add_context_args(p)
    p.add_argument("--ksck", action="store_true",
                   help="check the cluster after the write and print the ksck report")
    return p


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the job; returns the exit code. ``spark`` is used and left running if given,
    else the job starts its own session and stops it at the end."""
    parser = build_parser()
    args = parse_job_args(parser, argv)
    if isinstance(args, int):
        return args
    keys = [k.strip() for k in (args.keys or "").split(",") if k.strip()]
    if args.create and not keys:
        parser.print_usage(sys.stderr)
        print("ingest.py: error: --create needs --keys COL[,COL...]", file=sys.stderr)
        return EXIT_USAGE
    try:
        with (job_session("pyspark-kudu-ingest", spark) as session,
              open_context(session, args) as kudu):
            return _ingest(args, keys, session, kudu)
    except UsageError as e:
        print(f"ingest.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KuduError as e:
        print(f"ingest.py: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED


def _ingest(args: argparse.Namespace, keys: list[str], spark: SparkSession,
            kudu: KuduContext) -> int:
    """Check the table's existence against --create, read, create, write, check; the exit
    code. Spark jobs of each phase carry a description (the replication rounds run in the
    context's service thread and so are not labelled)."""
    table = args.table
    exists = kudu.table_exists(table)
    if args.create and exists:
        raise InvalidArgumentError(f"table {table} already exists; drop --create to write "
                                   f"into it")
    if not args.create and not exists:
        raise InvalidArgumentError(f"table {table} does not exist; pass --create --keys "
                                   f"COL[,COL...] to create it from the source's schema")
    sc = spark.sparkContext
    with _job_group(sc, f"ingest {args.format} {args.source} into {table}"):
        sc.setJobDescription(f"ingest: read {args.format} {args.source}")
        df = read_source(spark, args.source, args.format)
        if args.create:
            sc.setJobDescription(f"ingest: check key columns {keys} for nulls")
            _create_table(kudu, df, table, keys, args.hash_buckets, args.replicas)
            print(f"created table {table}: key ({', '.join(keys)}), {args.hash_buckets} hash "
                  f"buckets, {args.replicas} replicas")
        sc.setJobDescription(f"ingest: {args.operation} into {table}")
        code = _write(kudu, df, table, args.operation)
        if args.ksck:
            ok, report = ksck_report(RemoteSource(kudu.master).state(masters=True))
            print(report)
            code = code if ok else EXIT_FAILED
    return code


def read_source(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    """The source as a DataFrame (lazy except for csv schema inference).

    Raises:
        InvalidArgumentError: the source cannot be read (no such path, not that format).
    """
    try:
        if fmt == "csv":
            return spark.read.csv(path, header=True, inferSchema=True)
        if fmt == "json":
            return spark.read.json(path)
        if fmt == "parquet":
            return spark.read.parquet(path)
        return _read_delta(spark, path)
    except AnalysisException as e:
        raise InvalidArgumentError(f"cannot read {fmt} source {path}: "
                                   f"{str(e).splitlines()[0]}") from None


def _read_delta(spark: SparkSession, path: str) -> DataFrame:
    """The current version of a Delta table, read as its Parquet files (see the module doc).

    Tables whose files do not hold the logical rows as stored are refused: with deletion
    vectors the files still contain deleted rows, with column mapping their column names
    are physical ids.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        dt = DeltaTable(path)
    except (TableNotFoundError, DeltaError) as e:
        raise InvalidArgumentError(f"no Delta table at {path}: {e}") from None
    unsupported = {"deletionVectors", "columnMapping"} & set(dt.protocol().reader_features or ())
    if unsupported:
        raise InvalidArgumentError(
            f"Delta table {path} uses {sorted(unsupported)}, which reading its Parquet files "
            f"directly cannot honour; rewrite it without them (e.g. with deltalake's "
            f"optimize/compact) or export it to Parquet and use --format parquet")
    files = dt.file_uris()
    if not files:
        raise InvalidArgumentError(f"Delta table {path} (version {dt.version()}) has no data "
                                   f"files: nothing to ingest")
    # basePath lets Spark recover partition columns from the key=value directories.
    return spark.read.option("basePath", path).parquet(*files)


def _create_table(kudu: KuduContext, df: DataFrame, table: str, keys: list[str],
                  buckets: int, replicas: int) -> None:
    """Create ``table`` from ``df``'s schema with ``keys`` as primary key, after checking
    that the key columns exist and hold no nulls (so a bad source leaves no empty table)."""
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise InvalidArgumentError(
            f"key column(s) {missing} not in the source; its columns are {df.columns}")
    nulls = df.select([F.count(F.when(F.col(k).isNull(), 1)).alias(k) for k in keys]).first()
    assert nulls is not None  # an aggregate without grouping returns exactly one row
    with_nulls = {k: nulls[k] for k in keys if nulls[k]}
    if with_nulls:
        raise InvalidArgumentError(
            f"key column(s) hold nulls (rows per column: {with_nulls}); a primary key "
            f"column is NOT NULL: fix or filter the source")
    struct = StructType([StructField(f.name, f.dataType, f.nullable and f.name not in keys,
                                     f.metadata) for f in df.schema.fields])
    kudu.create_table(table, struct, keys=keys, replicas=replicas,
                      partitioning=PartitionSchema((HashDimension(tuple(keys), buckets),)))


def _write(kudu: KuduContext, df: DataFrame, table: str, operation: str) -> int:
    """Write ``df`` with a progress line; print the summary and return the exit code."""
    progress = ProgressLine(sys.stderr)
    errors: list[tuple[str, dict[str, object], str, str]] = []
    try:
        summary = kudu.write(df, table, operation, progress=progress)
        written, tablets = summary.rows_written, str(summary.tablets)
    except RowWriteError as e:
        # The other rows are written; the error carries no tablet count.
        written, errors, tablets = e.rows_written, e.errors, "not reported with row errors"
    finally:
        progress.done()
    elapsed = time.monotonic() - progress.start
    print(f"ingest summary: table {table}, operation {operation}")
    print(f"  rows written:    {written}")
    print(f"  row errors:      {len(errors)}" + ("; sample:" if errors else ""))
    for _tablet, row, status, message in errors[:_SAMPLE_ERRORS]:
        print(f"    {status} {row}: {message}")
    print(f"  tablets touched: {tablets}")
    print(f"  time:            {elapsed:.1f} s ({_rate(written, elapsed)})")
    return EXIT_FAILED if errors else EXIT_OK


def _rate(rows: int, seconds: float) -> str:
    rate = rows / max(seconds, 1e-9)
    return f"{rate:,.0f} rows/s" if rate >= 10 else f"{rate:.2f} rows/s"


class ProgressLine:
    """Console progress of a write: rows and batches committed, and the rate so far.

    On a terminal the line is rewritten in place; otherwise one line per report (the
    callback runs as each tablet's batches commit, so there are few).
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.start = time.monotonic()
        self._tty = out.isatty()
        self._shown = False

    def __call__(self, p: WriteProgress) -> None:
        line = (f"ingest: {p.rows_done:,}/{p.rows_total:,} rows, {p.batches_done}/"
                f"{p.batches_total} batches committed, "
                f"{_rate(p.rows_done, time.monotonic() - self.start)}")
        print(f"\r{line}" if self._tty else line, end="" if self._tty else "\n",
              file=self.out, flush=True)
        self._shown = True

    def done(self) -> None:
        if self._tty and self._shown:
            print(file=self.out)


@contextmanager
def _job_group(sc: SparkContext, description: str) -> Iterator[None]:
    """Label this thread's Spark jobs for the UI, then restore the previous labels."""
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    before = [sc.getLocalProperty(k) for k in keys]
    sc.setJobGroup("pyspark-kudu-ingest", description)
    try:
        yield
    finally:
        for k, v in zip(keys, before, strict=True):
            sc.setLocalProperty(k, v)  # type: ignore[arg-type]  # None removes the property



if __name__ == "__main__":
    raise SystemExit(main())
