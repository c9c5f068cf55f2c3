"""A write that did not ask for per-row results returns once committed; when no other write
follows, the service's settle round tells the replicas the commit index so that they apply
it (their own tablets become current for scans)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse
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


class _AnnouncingTransport(DirectTransport):
    """Announces a write to ``svc`` while the first round runs (as a write being planned
    during another write's round would)."""

    svc: ReplicationService | None = None

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]
            ) -> dict[str, list[PeerResponse] | None]:
        if self.svc is not None:
            self.svc.expect_write()
            self.svc = None
        return super().run(requests)


def _service(tmp_path: Path) -> tuple[_AnnouncingTransport, TabletLeader, ReplicationService]:
    transport = _AnnouncingTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)
    lead = TabletLeader(TabletReplicas("t", TS), "ts-a", transport)
    lead.create()
    lead.elect()
    svc = ReplicationService(transport, settle_delay_s=0.05)
    svc.write_hold_s = 3600.0
    transport.svc = svc
    return transport, lead, svc


def _no_settle_round_for(svc: ReplicationService, seconds: float) -> None:
    """Watch for ``seconds`` (20x the settle delay or more) that no settle round runs."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert svc.settle_rounds == 0, "a settle round ran while an announced write held it"
        time.sleep(0.01)


def test_an_announced_write_holds_the_settle_round_until_it_ended(tmp_path: Path) -> None:
    transport, lead, svc = _service(tmp_path)
    with svc:
        ((index, _, _),) = svc.submit(lead, [b"row-batch"]).result(timeout=60)
        _no_settle_round_for(svc, 1.0)
        followers = [ts for ts in TS if ts != "ts-a"]
        assert all(_applied(transport.roots[ts]) < index for ts in followers)
        svc.expected_write_ended()  # e.g. its Spark job failed: nothing will be submitted
        wait_until(lambda: svc.settle_rounds >= 1
                   and all(_applied(transport.roots[ts]) >= index for ts in TS), 30,
                   "the settle round once the announced write ended")


def test_a_submitted_write_ends_the_hold_and_carries_the_commit_index(tmp_path: Path) -> None:
    transport, lead, svc = _service(tmp_path)
    with svc:
        ((first, _, _),) = svc.submit(lead, [b"first"]).result(timeout=60)
        _no_settle_round_for(svc, 0.5)
        rounds = transport.rounds
        ((second, _, _),) = svc.submit(lead, [b"second"]).result(timeout=60)
        # One round: the commit index of the first write rode with the second.
        assert transport.rounds == rounds + 1 and svc.settle_rounds == 0
        assert all(_applied(transport.roots[ts]) >= first for ts in TS)
        wait_until(lambda: svc.settle_rounds >= 1
                   and all(_applied(transport.roots[ts]) >= second for ts in TS), 30,
                   "the settle round after the announced write was submitted")


def test_an_announced_write_that_never_comes_holds_the_settle_round_at_most_the_hold(
        tmp_path: Path) -> None:
    transport, lead, svc = _service(tmp_path)
    svc.write_hold_s = 0.5
    with svc:
        ((index, _, _),) = svc.submit(lead, [b"row-batch"]).result(timeout=60)
        wait_until(lambda: svc.settle_rounds >= 1
                   and all(_applied(transport.roots[ts]) >= index for ts in TS), 30,
                   "the settle round once the hold expired")
