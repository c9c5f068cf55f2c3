"""The README's demo command runs ``jobs/demo.py``; its table part must tell the truth."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pyspark.sql import SparkSession

DEMO = Path(__file__).resolve().parents[2] / "jobs" / "demo.py"


def test_demo_table_part_writes_reports_a_duplicate_and_reads_everything_back(
    spark: SparkSession,
) -> None:
    spec = importlib.util.spec_from_file_location("demo_job", DEMO)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines: list[str] = []
    assert mod.table_demo(20, lines.append, spark) == 21
    assert "AlreadyPresent for id 0" in " ".join(lines)
    assert lines[-1].startswith("read back 21 rows; id=7 -> person-7")
