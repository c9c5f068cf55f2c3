"""A write that did not ask for per-row results returns once committed; when no other write
follows, the service's settle round tells the replicas the commit index so that they apply
it (their own tablets become current for scans)."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.spark.replication.write_service import ReplicationService
from pyspark_kudu.wal import SyncPolicy, WalOptions
from tests.waiting import wait_until

OPTS = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.NONE, preallocate=False)
TS = ("ts-a", "ts-b", "ts-c")


def _applied(root: str) -> int:
    path = Path(root, "tablets", "t", "applied")
    return int(json.loads(path.read_text())["index"]) if path.exists() else 0


def test_replicas_apply_a_committed_write_once_the_service_is_idle(tmp_path: Path) -> None:
    transport = DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)
    lead = TabletLeader(TabletReplicas("t", TS), "ts-a", transport)
    lead.create()
    lead.elect()
    with ReplicationService(transport, settle_delay_s=0.05) as svc:
        ((index, _, result),) = svc.submit(lead, [b"row-batch"]).result(timeout=60)
        assert result is None  # not asked for: returned on commit
        # The counter moves once the settle round returned, just after the replicas applied.
        wait_until(lambda: svc.settle_rounds >= 1
                   and all(_applied(transport.roots[ts]) >= index for ts in TS), 30,
                   "every replica applying the committed write in the settle round")
        assert lead._results == {}
