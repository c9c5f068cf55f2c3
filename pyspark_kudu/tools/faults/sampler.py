"""The replication state of a fault run, sampled every second into ``samples.jsonl``.

A sample is ksck (:mod:`pyspark_kudu.tools.cluster`) over the master's catalog plus two
facts ksck cannot see: ``voters_on_down_hosts`` (tablets with fewer voters on hosts that
have an executor than their replication factor) and ``failed_voters`` (voters whose replica
directory carries the ``failed`` marker: found failed, not yet reported or replaced -- ksck
still calls such a tablet healthy). A sample is *fully replicated* when none of these show.

Thread-safety: :class:`ReplicationSampler` samples on one thread of its own; its query
methods may be called from any thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ReplicationSampler", "clean_since", "fully_replicated", "restored_after"]


def fully_replicated(s: dict[str, Any]) -> bool:
    return ("error" not in s and s.get("tablets", 0) > 0
            and not s["under_replicated"] and not s["unavailable"] and not s["recovering"]
            and not s["voters_on_down_hosts"] and not s.get("failed_voters"))


def clean_since(recent: Sequence[dict[str, Any]], t: float) -> bool:
    """The last two of ``recent`` were both taken at ``t`` or later and are fully
    replicated (one clean sample may predate the driver noticing a lost executor)."""
    last = list(recent[-2:])
    return len(last) == 2 and all(float(s["t"]) >= t and fully_replicated(s) for s in last)


def restored_after(recent: Sequence[dict[str, Any]], faults_end: float) -> float | None:
    """Seconds from the end of the faults to full replication, once the last three samples
    (all taken after the faults ended) show it -- one clean sample right after a kill may
    predate the driver noticing the lost executor."""
    if len(recent) < 3 or not all(fully_replicated(s) and float(s["t"]) >= faults_end
                                  for s in recent):
        return None
    return max(0.0, float(recent[0]["t"]) - faults_end)


class ReplicationSampler:
    """ksck every second (see the module docstring).

    ``executor_hosts()``: hosts the driver lists an executor on. ``data_root(host)``: the
    host's data root, where a replica's ``failed`` marker is looked for.
    """

    def __init__(self, master_address: str, clock: Callable[[], float],
                 executor_hosts: Callable[[], set[str]], data_root: Callable[[str], Path],
                 path: Path) -> None:
        from pyspark_kudu.master.client import MasterClient

        self.client = MasterClient(master_address, timeout_s=3.0, rpc_timeout_s=2.0)
        self.clock = clock
        self.executor_hosts = executor_hosts
        self.data_root = data_root
        self.path = path
        self.samples: list[dict[str, Any]] = []
        self._voters: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ksck-sampler")

    def start(self) -> ReplicationSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self.client.close()

    def recent(self, n: int) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(s) for s in self.samples[-n:]]

    def healthy_since(self, t: float) -> bool:
        """The last two samples were both taken at ``t`` or later and are fully
        replicated."""
        return clean_since(self.recent(2), t)

    def voters_on(self, host: str) -> frozenset[str]:
        """Tablet ids of the voter replicas on ``host`` in the last good sample."""
        with self._lock:
            return self._voters.get(host, frozenset())

    def sample(self) -> dict[str, Any]:
        from pyspark_kudu.tools.cluster import RECOVERING, UNAVAILABLE, UNDER_REPLICATED, ksck
        from pyspark_kudu.tools.connect import RemoteSource

        t = self.clock()
        state = RemoteSource(self.client).state()
        snap = state.snapshot()
        result = ksck(snap)
        statuses = [u["Status"] for u in result.unhealthy_tablets]
        hosts = self.executor_hosts()
        by_uuid = {ts.uuid: ts.host for ts in snap.tservers}
        rfs = {t.table_id: t.replication_factor for t in snap.tables}
        short = sum(1 for tb in snap.tablets
                    if sum(1 for r in tb.voters if by_uuid.get(r.ts_uuid) in hosts)
                    < rfs.get(tb.table_id, 3))
        voters: dict[str, set[str]] = {}
        failed = 0
        for tb in snap.tablets:
            for r in tb.voters:
                host = by_uuid.get(r.ts_uuid)
                if host is None:
                    continue
                voters.setdefault(host, set()).add(tb.tablet_id)
                if (self.data_root(host) / "tablets" / tb.tablet_id / "failed").exists():
                    failed += 1
        with self._lock:
            self._voters = {h: frozenset(v) for h, v in voters.items()}
        return {"t": round(t, 2), "under_replicated": statuses.count(UNDER_REPLICATED),
                "unavailable": statuses.count(UNAVAILABLE),
                "recovering": statuses.count(RECOVERING),
                "tablets": len(snap.tablets), "live_tservers": len(state.live or ()),
                "tservers": len(snap.tservers), "executor_hosts": len(hosts),
                "voters_on_down_hosts": short, "failed_voters": failed}

    def _run(self) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    s = self.sample()
                except Exception as e:  # master busy or restarting: a gap in the samples
                    s = {"t": round(self.clock(), 2), "error": f"{type(e).__name__}: {e}"}
                with self._lock:
                    self.samples.append(s)
                f.write(json.dumps(s) + "\n")
                f.flush()
                self._stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))  # 1 s period
