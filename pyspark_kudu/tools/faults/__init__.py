"""Fault harness: a workload under injected faults, a history checker and
a report.

* :mod:`.history` -- every operation as JSON lines (invoke, then ok / fail / info);
* :mod:`.checker` -- lost acknowledged writes, visible failed writes, fabricated values and
  per-key linearizability (Knossos/Porcupine-style search);
* :mod:`.report` -- ``report.json`` and ``timeline.png``;
* :mod:`.inject` -- fault schedules and the faults themselves; :mod:`.injector` runs a
  schedule, waiting for each fault's precondition under a deadline (a fault is applied or
  the run fails, never skipped);
* :mod:`.workload` -- the client threads (only outcome-unknown errors make an op ``info``);
* :mod:`.sampler` -- ksck every second, and when replication counts as whole again;
* :mod:`.harness` -- the standalone Spark cluster, the schedule, the workload, the checks;
  ``python -m pyspark_kudu.tools.faults --mode short --seed 1 --out DIR``;
* :mod:`.chaos` -- ``--mode chaos``: ``format("kudu")`` writes and reads while an executor is
  killed every few seconds; :mod:`.chaos_report` -- its counts, latencies and failures.
"""

from pyspark_kudu.tools.faults.checker import CheckResult, Violation, check
from pyspark_kudu.tools.faults.history import HistoryWriter, Op, load_history

__all__ = ["CheckResult", "HistoryWriter", "Op", "Violation", "check", "load_history"]
