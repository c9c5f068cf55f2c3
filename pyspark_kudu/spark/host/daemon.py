"""A PySpark worker daemon that imports pyspark-kudu's executor-side modules before forking,
and starts the host's resident tablet server (:mod:`~.tablet_server`) first.

Every pinned task runs in a Python worker forked by the executor's daemon. A worker that has
not run pyspark-kudu code before imports it on its first task (pyarrow, numpy, pandas via
``pyarrow.dataset``, the tablet and WAL code): ~0.4 s on an idle host, measured 2.5-4.5 s
on the 6-worker test cluster under load, paid again by every new worker (a zipped
replication stage needs two at once). This daemon imports them once; forked workers inherit
them. Enable it with::

    spark.python.daemon.module   pyspark_kudu.spark.host.daemon

(``conf/spark-defaults.conf`` sets it; it must be set before the SparkContext starts).
Nothing here starts threads before forking: importing pyarrow does not start its pools.

**Frozen heap.** PySpark's worker runs a full ``gc.collect()`` after every task. In a
worker forked from this daemon that walks the ~90,000 objects the imports made, and the
first walk copies every page holding them (copy on write): 35-70 ms per task on an idle
host, measured, more when the host's cores are shared, and a reused worker cannot start its
next task (the next round's) before it is done. So the daemon freezes what it imported
(``gc.freeze()``, Python's advice for processes that fork without exec) before it forks the
resident server and the workers: their collections skip those objects, which stay shared
with the daemon. Frozen objects are never freed; these are modules and their constants,
which live as long as the process anyway.
"""

from __future__ import annotations

import gc

from pyspark.daemon import manager

import pyspark_kudu.spark.host.round_tasks  # noqa: F401  (handlers, dataplane, replica cache, tablet, wal)
from pyspark_kudu.tablet import load_all

load_all()  # the tablet package imports its parts on first use: all of them, before forking

__all__ = ["DAEMON_CONF", "SESSION_CONF", "freeze_imports"]

DAEMON_CONF = ("spark.python.daemon.module", "pyspark_kudu.spark.host.daemon")

#: Settings every SparkSession running pyspark-kudu should start with (they are read when the
#: SparkContext starts): the daemon above, and a barrier stage that needs more slots than
#: exist (a round submitted just as an executor died, before the driver knew) failing after
#: ~10 s (2 s x 5) instead of Spark's 15 s x 40 -- the round is then retried without that
#: host (DESIGN §4). Shorter is not better: with 1 s x 3 the fault harness (seed 2) saw a
#: replication round's job never finish after a lost host.
#: ``SparkSession.builder.config(map=dict(SESSION_CONF))``.
SESSION_CONF: tuple[tuple[str, str], ...] = (
    DAEMON_CONF,
    ("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "2s"),
    ("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "5"),
)


def freeze_imports() -> int:
    """Collect once, then freeze every object tracked so far (module docstring); returns
    how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


if __name__ == "__main__":
    # This host's resident tablet server, forked before any worker (tablet_server.py).
    from pyspark_kudu.spark.host.tablet_server import start_resident

    freeze_imports()
    start_resident()
    freeze_imports()  # and what starting the server made in this process, before the workers
    manager()
