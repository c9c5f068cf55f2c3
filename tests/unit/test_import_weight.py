"""What the driver's fresh Python workers import for the ``kudu`` data source.

PySpark stops a Python worker idle for a minute (``PythonWorkerFactory``'s idle timeout,
not configurable), and the driver's workers that plan and commit a ``format("kudu")`` write
or plan a read come from PySpark's own daemon, which preloads nothing of this package. So
after a minute without work, every such worker imports :mod:`pyspark_kudu.spark.api.datasource`
afresh: measured on the 6-worker cluster, a 1-row upsert took 2.9-3.1 s after 75 s idle
against 0.6-1.0 s right after another, ~0.9 CPU-s in each of the two driver workers. The
module must therefore not drag in the executor-side code (tablet, WAL, consensus, staging,
replica readers) nor pyarrow's dataset module with pandas.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Modules a planning or committing worker must not import (they were ~0.35 of the ~0.4 s).
HEAVY = ("pandas", "pyarrow.dataset", "pyarrow.parquet", "pyarrow.flight", "fsspec",
         "pyspark_kudu.tablet.tablet", "pyspark_kudu.wal", "pyspark_kudu.consensus",
         "pyspark_kudu.spark.host.dataplane", "pyspark_kudu.spark.host.replica_reader",
         "pyspark_kudu.spark.replication.write_service")


def _imported_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("worker", ["write_into_data_source", "commit_data_source_write",
                                    "plan_data_source_read"])
def test_the_data_source_module_imports_nothing_executor_side(worker: str) -> None:
    loaded = _imported_after(f"import pyspark.sql.worker.{worker}\n"
                             "import pyspark_kudu.spark.api.datasource")
    assert "pyspark_kudu.spark.api.datasource" in loaded
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not heavy, f"importing the kudu data source also imported {heavy}"


def test_the_tablet_package_imports_its_parts_on_first_use() -> None:
    loaded = _imported_after("from pyspark_kudu.tablet import OpType")
    assert "pyspark_kudu.tablet.ops" in loaded
    assert "pyspark_kudu.tablet.tablet" not in loaded
    everything = _imported_after("import pyspark_kudu.tablet as t\nt.load_all()\n"
                                 "assert all(getattr(t, n) is not None for n in t.__all__)")
    assert {"pyspark_kudu.tablet.tablet", "pyspark_kudu.tablet.copy",
            "pyspark_kudu.tablet.committed_log"} <= everything


def test_an_unknown_tablet_name_is_an_attribute_error() -> None:
    import pyspark_kudu.tablet as t

    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        t.Nope  # noqa: B018
    assert set(t.__all__) <= set(dir(t))


def test_the_executor_daemon_preloads_every_tablet_part() -> None:
    loaded = _imported_after("import pyspark_kudu.spark.host.daemon")
    assert {f"pyspark_kudu.tablet.{m}" for m in ("tablet", "copy", "committed_log", "scan",
                                                 "faults", "state")} <= loaded
