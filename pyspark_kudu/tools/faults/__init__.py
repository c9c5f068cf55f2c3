"""Fault harness: a workload under injected faults, a history checker and
a report.

* :mod:`.history` -- every operation as JSON lines (invoke, then ok / fail / info);
* :mod:`.checker` -- lost acknowledged writes, visible failed writes, fabricated values and
  per-key linearizability (Knossos/Porcupine-style search);
* :mod:`.report` -- ``report.json`` and ``timeline.png``;
* :mod:`.harness` -- the standalone Spark cluster, the fault schedule and the workload;
  ``python -m pyspark_kudu.tools.faults --mode short --seed 1 --out DIR``.
"""

from pyspark_kudu.tools.faults.checker import CheckResult, Violation, check
from pyspark_kudu.tools.faults.history import HistoryWriter, Op, load_history

__all__ = ["CheckResult", "HistoryWriter", "Op", "Violation", "check", "load_history"]
