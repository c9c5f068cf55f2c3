"""``pyspark-kudu cluster ksck`` against the test cluster (issue 9 "Done when"): a standalone
master with the test topology's location mapping, tablet servers registered and kept live by
a KuduContext, an RF=3 table: ksck shows the three racks and no violation, and every tablet
server's address (as ksck and ``tserver list`` show it) is its host's resident server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.master.localcluster import MasterProcessCluster
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.tserver_client import ping

REPO = Path(__file__).resolve().parents[2]
STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
MAPPING = f"{REPO / 'conf' / 'location_mapping.sh'} {REPO / 'conf' / 'topology.txt'}"


@pytest.fixture(scope="module")
def racked_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcessCluster]:
    group = MasterProcessCluster(str(tmp_path_factory.mktemp("ksck-master")), 1,
                                 extra_args=["--location-mapping-cmd", MAPPING])
    try:
        group.start()
        group.wait_for_leader(60)
        yield group
    finally:
        group.stop()


def _ksck(master: MasterProcessCluster, fmt: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyspark_kudu.tools.cli", "cluster", "ksck",
         "--master", master.master_addresses, "--format", fmt],
        capture_output=True, text=True, timeout=120, cwd=REPO)


def test_cluster_ksck_shows_the_racks_and_zero_violations(
    cluster_spark: SparkSession, racked_master: MasterProcessCluster, tmp_path: Path,
) -> None:
    with KuduContext(cluster_spark, master=racked_master.master_addresses,
                     warehouse=str(tmp_path / "wh")) as kudu:
        kudu.create_table("racked", STRUCT, keys=["id"], replicas=3,
                          partitioning=PartitionSchema((HashDimension(("id",), 3),)))
        kudu.insert_rows(cluster_spark.createDataFrame([(i, str(i)) for i in range(30)],
                                                       STRUCT), "racked")
        text = _ksck(racked_master, "text")
        assert text.returncode == 0, f"ksck exit {text.returncode}: {text.stdout}{text.stderr}"
        for rack in ("/dc1/rack1", "/dc1/rack2", "/dc1/rack3"):
            assert rack in text.stdout, f"{rack} missing from ksck output:\n{text.stdout}"
        report = json.loads(_ksck(racked_master, "json").stdout)
        # Each tablet server's address is its host's resident tablet server, which answers.
        for ts in report["tservers"]:
            _, _, port = ts["Address"].rpartition(":")
            assert port.isdigit() and int(port) > 0, ts
            assert ping(ts["Address"], kudu._secret.encode())["address"] == ts["Address"]
        listed = subprocess.run(
            [sys.executable, "-m", "pyspark_kudu.tools.cli", "tserver", "list",
             "--master", racked_master.master_addresses, "--columns=uuid,rpc-addresses"],
            capture_output=True, text=True, timeout=120, cwd=REPO)
        assert listed.returncode == 0, listed.stderr
        for ts in report["tservers"]:
            assert ts["Address"] in listed.stdout, listed.stdout
    assert report["ok"] is True and report["placement_policy_violations"] == [], report
    assert {t["Location"] for t in report["tservers"]} == {"/dc1/rack1", "/dc1/rack2",
                                                            "/dc1/rack3"}, report["tservers"]
