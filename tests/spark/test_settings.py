"""A ``KuduContext``'s settings in local mode: each is honoured or refused, never ignored.

Refusals happen before the context starts anything, so those tests are cheap; one context
(module fixture) checks that Spark settings are honoured. The pure rules are unit-tested in
``tests/unit/test_settings_unit.py``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.spark.api import context, tablet_servers
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.api.settings import (
    HEAL_INTERVAL_CONF,
    LOCATION_MAPPING_CMD_CONF,
    LOCATION_MAPPING_TIMEOUT_CONF,
)
from pyspark_kudu.spark.host.identity import DATA_ROOT_CONF, DATA_ROOT_ENV, current_host
from pyspark_kudu.spark.replication.lease_keeper import LEASE_CONF

SetConf = Callable[[dict[str, str]], None]


def _set_conf(spark: SparkSession, settings: dict[str, str]) -> Callable[[], None]:
    """Set ``settings`` on the running SparkContext (what ``KuduContext`` reads); returns
    the undo. The session is shared by every test, so each setting must be removed again."""
    jconf = spark.sparkContext._conf
    for k, v in settings.items():
        jconf.set(k, v)

    def undo() -> None:
        for k in settings:
            jconf._jconf.remove(k)  # type: ignore[union-attr]
    return undo


@pytest.fixture
def spark_conf(spark: SparkSession) -> Iterator[SetConf]:
    undos: list[Callable[[], None]] = []
    yield lambda settings: undos.append(_set_conf(spark, settings))
    for undo in undos:
        undo()


@pytest.fixture(scope="module")
def kudu(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KuduContext]:
    """A context configured only through Spark settings: a location mapping command that
    puts every host in /rack9, and no leadership leases."""
    base = tmp_path_factory.mktemp("settings")
    script = base / "map.sh"
    script.write_text("#!/bin/sh\necho /rack9\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    undo = _set_conf(spark, {LOCATION_MAPPING_CMD_CONF: str(script),
                             LOCATION_MAPPING_TIMEOUT_CONF: "20", LEASE_CONF: "0"})
    try:
        ctx = KuduContext(spark, warehouse=str(base / "wh"), heal=False)
    finally:
        undo()
    with ctx:
        yield ctx


def test_location_mapping_spark_settings_are_honoured(kudu: KuduContext) -> None:
    servers = kudu.master.list_tservers()
    assert len(servers) == 3
    assert {t["location"] for t in servers} == {"/rack9"}


def test_a_zero_lease_setting_turns_leases_off(kudu: KuduContext) -> None:
    # Before, spark.kudu.leaderLeaseSec=0 was replaced by the 10 s default.
    assert kudu.leases.ttl_s == 0 and not kudu.leases.enabled


def test_split_size_bytes_is_refused(spark: SparkSession, kudu: KuduContext) -> None:
    kudu.create_table("split", spark.range(1).schema, keys=["id"], replicas=1)
    reader = (spark.read.format("kudu").option("kudu.table", "split")
              .option("kudu.splitSizeBytes", "1048576"))
    with pytest.raises(Exception, match=re.escape(
            "kudu.splitSizeBytes=1048576 is not supported: scans are one Spark partition per "
            "tablet, and splitting a tablet by size is not supported yet")):
        reader.load().collect()


@pytest.mark.parametrize("kwargs", [
    {"location_mapping_cmd": "map.sh"},
    {"location_mapping_timeout_s": 10.0},
    {"failed_after_s": 60.0},
], ids=lambda kw: next(iter(kw)))
def test_embedded_master_arguments_with_master_are_a_usage_error(
        spark: SparkSession, tmp_path: Path, kwargs: dict[str, object]) -> None:
    name = next(iter(kwargs))
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{name}: setting(s) of the embedded master, but this KuduContext uses the "
            f"standalone masters 127.0.0.1:7051")) as info:
        KuduContext(spark, master="127.0.0.1:7051", warehouse=str(tmp_path / "wh"),
                    **kwargs)  # type: ignore[arg-type]
    assert "pyspark-kudu master run --" in str(info.value)
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize("key", [LOCATION_MAPPING_CMD_CONF, LOCATION_MAPPING_TIMEOUT_CONF])
def test_embedded_master_spark_settings_with_master_are_a_usage_error(
        spark: SparkSession, spark_conf: SetConf, key: str) -> None:
    spark_conf({key: "5"})
    with pytest.raises(InvalidArgumentError,
                       match=re.escape(f"{key}: setting(s) of the embedded master")):
        KuduContext(spark, master="127.0.0.1:7051")


def test_a_zero_timeout_argument_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(
            "round_timeout_s=0 is not usable: it must be more than 0 seconds")):
        KuduContext(spark, warehouse=str(tmp_path / "wh"), round_timeout_s=0)
    assert not (tmp_path / "wh").exists()  # refused before the master or servers started


@pytest.mark.parametrize(("value", "message"), [
    ("0", f"{HEAL_INTERVAL_CONF}=0 is not usable: it must be more than 0 seconds"),
    ("5s", f"{HEAL_INTERVAL_CONF}='5s' is not a number of seconds"),
])
def test_a_zero_or_malformed_spark_setting_is_refused(
        spark: SparkSession, spark_conf: SetConf, tmp_path: Path, value: str,
        message: str) -> None:
    spark_conf({HEAL_INTERVAL_CONF: value})
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        KuduContext(spark, warehouse=str(tmp_path / "wh"))
    assert not (tmp_path / "wh").exists()


@pytest.mark.skipif(bool(os.environ.get(DATA_ROOT_ENV)),
                    reason=f"the Python workers inherit this process's {DATA_ROOT_ENV}")
def test_a_discovery_task_without_data_root_fails_as_a_usage_error(spark: SparkSession) -> None:
    """What a KuduContext on a cluster sees from an executor host with neither setting: the
    task's refusal, out of Spark's error (no cluster here: a local task runs the same code)."""
    with pytest.raises(Exception) as info:  # Spark's wrapper of the task's error
        spark.sparkContext.parallelize([current_host()], 1).map(
            partial(tablet_servers._identify, conf_root=None)).collect()
    usage = context._task_usage_error(info.value)
    assert isinstance(usage, InvalidArgumentError)
    assert str(usage).startswith("no tablet server data root on host ")
    assert DATA_ROOT_ENV in str(usage) and DATA_ROOT_CONF in str(usage)
