"""The ``spark.kudu.*`` settings a ``KuduContext`` reads, and how: each is its argument if
given, else the Spark setting if set, else the default; a value that cannot be honoured is
refused with an error naming it, never replaced by the default.

Thread-safety: constants and pure functions.
"""

from __future__ import annotations

import math
from typing import Any

from pyspark import SparkConf

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.locations import DEFAULT_MAPPING_TIMEOUT_S

__all__ = [
    "ARROW_BATCH_CONF",
    "ARROW_BATCH_ROWS",
    "AUTO_REBALANCE_CONF",
    "FAILED_AFTER_CONF",
    "HEAL_ENABLED_CONF",
    "HEAL_INTERVAL_CONF",
    "HEAL_MAX_MOVES_CONF",
    "HEARTBEAT_CONF",
    "LOCATION_MAPPING_CMD_CONF",
    "LOCATION_MAPPING_TIMEOUT_CONF",
    "ROUND_TIMEOUT_CONF",
    "WAREHOUSE_CONF",
    "embedded_master_settings",
    "heal_max_moves",
    "raise_arrow_batch",
    "restore_arrow_batch",
    "seconds",
]

WAREHOUSE_CONF = "spark.kudu.warehouse"
#: Rows per Arrow batch between Spark's JVM and Python workers: what a write's staging tasks
#: receive their rows in. Spark's default is 10,000; the staging tasks encode batches of up to
#: 65,536 rows (``ARROW_BATCH_ROWS``), and with batches that size a 10M-row upsert's staging
#: job took 6.8 s against 8.3 s (medians of 3, alternating, 6-worker cluster), Spark's own
#: hand-over to Python 4.0 s against 4.8 s.
ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
ARROW_BATCH_ROWS = 65536
_SPARK_ARROW_BATCH = "10000"
HEARTBEAT_CONF = "spark.kudu.heartbeatIntervalSec"
HEAL_ENABLED_CONF = "spark.kudu.heal.enabled"
HEAL_INTERVAL_CONF = "spark.kudu.heal.intervalSec"
HEAL_MAX_MOVES_CONF = "spark.kudu.heal.maxMoves"
FAILED_AFTER_CONF = "spark.kudu.followerUnavailableConsideredFailedSec"
AUTO_REBALANCE_CONF = "spark.kudu.autoRebalance"
ROUND_TIMEOUT_CONF = "spark.kudu.roundTimeoutSec"
LOCATION_MAPPING_CMD_CONF = "spark.kudu.locationMappingCmd"
LOCATION_MAPPING_TIMEOUT_CONF = "spark.kudu.locationMappingTimeoutSec"

# The embedded master's settings, each with the flag of `pyspark-kudu master run` that sets
# it on a standalone master (pyspark_kudu/tools/cli.py).
_MAPPING_CMD_FLAG = "--location-mapping-cmd"
_MAPPING_TIMEOUT_FLAG = "--location-mapping-timeout-s"
_FAILED_AFTER_FLAG = "--follower-unavailable-considered-failed-sec"


def embedded_master_settings(conf: SparkConf, master: str | None, cmd: str | None,
                              timeout_s: float | None, failed_after_s: float | None
                              ) -> dict[str, Any]:
    """The keyword arguments of the embedded :class:`EmbeddedMaster` (``master`` None).

    Raises:
        InvalidArgumentError: with a standalone ``master``, any of these settings given as
            an argument or a Spark setting (the standalone master would never see it); an
            invalid timeout.
    """
    if master is not None:
        has = conf.contains
        given = [(name, flag) for name, flag, is_set in (
            ("location_mapping_cmd", _MAPPING_CMD_FLAG, cmd is not None),
            ("location_mapping_timeout_s", _MAPPING_TIMEOUT_FLAG, timeout_s is not None),
            ("failed_after_s", _FAILED_AFTER_FLAG, failed_after_s is not None),
            (LOCATION_MAPPING_CMD_CONF, _MAPPING_CMD_FLAG, has(LOCATION_MAPPING_CMD_CONF)),
            (LOCATION_MAPPING_TIMEOUT_CONF, _MAPPING_TIMEOUT_FLAG,
             has(LOCATION_MAPPING_TIMEOUT_CONF)),
            (FAILED_AFTER_CONF, _FAILED_AFTER_FLAG, has(FAILED_AFTER_CONF)),
        ) if is_set]
        if given:
            flags = " ".join(dict.fromkeys(f"{f} ..." for _, f in given))
            raise InvalidArgumentError(
                f"{', '.join(n for n, _ in given)}: setting(s) of the embedded master, but this "
                f"KuduContext uses the standalone masters {master}, which never see them; a "
                f"standalone master takes them on its own command line (pyspark-kudu master run "
                f"{flags}, or its --conf file): drop them here")
        return {}
    return {
        "location_mapping_cmd": cmd if cmd is not None else conf.get(
            LOCATION_MAPPING_CMD_CONF, None),
        "location_mapping_timeout_s": seconds(conf, LOCATION_MAPPING_TIMEOUT_CONF,
                                               DEFAULT_MAPPING_TIMEOUT_S,
                                               "location_mapping_timeout_s", timeout_s),
        "follower_unavailable_considered_failed_s": seconds(
            conf, FAILED_AFTER_CONF, 300.0, "failed_after_s", failed_after_s),
    }


def seconds(conf: SparkConf, key: str, default: float, arg_name: str = "",
             arg: float | None = None, *, zero_ok: bool = False) -> float:
    """A timeout or interval: the argument ``arg_name`` if given (not None), else the Spark
    setting ``key`` if set, else ``default``.

    Raises:
        InvalidArgumentError: the value is zero (unless ``zero_ok``: 0 means something, as
            no leases), negative or not a finite number; naming the argument or setting.
            A 0 is refused rather than replaced by the default, which would ignore it.
    """
    source: str
    if arg is not None:
        source, value = arg_name, float(arg)
    else:
        raw = conf.get(key, None)
        if raw is None:
            return default
        source = key
        try:
            value = float(raw)
        except ValueError:
            raise InvalidArgumentError(
                f"{key}={raw!r} is not a number of seconds (default {default:g})") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        least = "0 or more" if zero_ok else "more than 0"
        raise InvalidArgumentError(
            f"{source}={value:g} is not usable: it must be {least} seconds "
            f"(default {default:g})")
    return value


def heal_max_moves(conf: SparkConf, default: int = 4) -> int:
    """``spark.kudu.heal.maxMoves``, else ``default``.

    Raises:
        InvalidArgumentError: not an integer, or less than 1: a healer allowed no move would
            quietly never heal (``spark.kudu.heal.enabled=false`` says so instead).
    """
    raw = conf.get(HEAL_MAX_MOVES_CONF, None)
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise InvalidArgumentError(
            f"{HEAL_MAX_MOVES_CONF}={raw!r} is not an integer (default {default})") from None
    if n < 1:
        raise InvalidArgumentError(
            f"{HEAL_MAX_MOVES_CONF}={n} is not usable: it must be 1 or more (default "
            f"{default}); to stop healing set {HEAL_ENABLED_CONF}=false")
    return n


def raise_arrow_batch(spark: Any) -> str | None:
    """Set ``ARROW_BATCH_CONF`` to ``ARROW_BATCH_ROWS`` in ``spark``'s session unless the
    application chose a value (in its configuration, or at run time); returns the value it
    replaced (None: left alone). The batch size also applies to the session's other Arrow
    work (pandas UDFs, ``mapInArrow``): documented in the README."""
    if spark.sparkContext.getConf().contains(ARROW_BATCH_CONF):
        return None
    now = str(spark.conf.get(ARROW_BATCH_CONF, _SPARK_ARROW_BATCH))
    if now != _SPARK_ARROW_BATCH:
        return None
    spark.conf.set(ARROW_BATCH_CONF, str(ARROW_BATCH_ROWS))
    return now


def restore_arrow_batch(spark: Any, replaced: str | None) -> None:
    """Undo :func:`raise_arrow_batch` (``replaced``: what it returned) if the value is still
    the one it set."""
    if replaced is None:
        return
    try:
        if str(spark.conf.get(ARROW_BATCH_CONF, "")) == str(ARROW_BATCH_ROWS):
            spark.conf.unset(ARROW_BATCH_CONF)
    except Exception:  # the session is stopping: nothing to restore
        pass
