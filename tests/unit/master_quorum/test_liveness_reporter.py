"""The driver's liveness reporter heartbeats exactly the tablet servers whose host has an
executor; the master sees the others go quiet (pyspark_kudu.spark.healing.liveness)."""

from __future__ import annotations

from pathlib import Path

from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.spark.healing.liveness import LivenessReporter
from tests.waiting import wait_until

SERVERS = [TServerMeta(f"ts{i}", f"127.0.0.{i + 2}", data_root=f"/d{i}") for i in range(3)]


def test_only_servers_with_an_executor_stay_live(tmp_path: Path) -> None:
    hosts = {s.host for s in SERVERS}
    with EmbeddedMaster(str(tmp_path), 1, tserver_unresponsive_s=1.0) as master:
        client = master.client()
        reporter = LivenessReporter(client, SERVERS, lambda: set(hosts), interval_s=0.1).start()
        try:
            def live() -> set[str]:
                return {t["uuid"] for t in client.list_tservers() if t["live"]}

            wait_until(lambda: live() == {"ts0", "ts1", "ts2"}, 30,
                       "all three tablet servers becoming live")
            hosts.discard("127.0.0.3")  # ts1's executor is gone
            wait_until(lambda: live() == {"ts0", "ts2"}, 30,
                       "the master marking ts1 (no executor) not live")
            assert "ts1" not in reporter.last_live
            hosts.add("127.0.0.3")
            wait_until(lambda: live() == {"ts0", "ts1", "ts2"}, 30, "ts1 becoming live again")
        finally:
            reporter.stop()


def test_lost_servers_are_reported_once_when_their_executor_goes(tmp_path: Path) -> None:
    hosts = {s.host for s in SERVERS}
    lost: list[set[str]] = []
    with EmbeddedMaster(str(tmp_path), 1) as master:
        reporter = LivenessReporter(master.client(), SERVERS, lambda: set(hosts),
                                    interval_s=60, on_lost=lost.append)
        reporter.beat_once()
        assert lost == []  # nothing was live before the first beat
        hosts.discard("127.0.0.3")
        hosts.discard("127.0.0.4")
        assert reporter.beat_once() == {"ts0"}
        assert lost == [{"ts1", "ts2"}]
        reporter.beat_once()  # still gone: not reported again
        assert lost == [{"ts1", "ts2"}]
        hosts.add("127.0.0.3")
        reporter.beat_once()  # back: nothing lost
        hosts.discard("127.0.0.3")
        reporter.beat_once()  # gone again: reported again
        assert lost == [{"ts1", "ts2"}, {"ts1"}]


def test_returned_servers_are_reported_once_but_not_on_the_first_beat(tmp_path: Path) -> None:
    hosts = {"127.0.0.2"}
    found: list[set[str]] = []
    with EmbeddedMaster(str(tmp_path), 1) as master:
        reporter = LivenessReporter(master.client(), SERVERS, lambda: set(hosts),
                                    interval_s=60, on_found=found.append)
        reporter.beat_once()
        assert found == []  # the first beat finds everything: nothing came back
        hosts |= {"127.0.0.3", "127.0.0.4"}
        reporter.beat_once()
        assert found == [{"ts1", "ts2"}]
        reporter.beat_once()
        assert found == [{"ts1", "ts2"}]
