"""Executor Python memory for benchmarks: peak RSS per phase, sampled from ``/proc``, and
what the tablet servers say they hold (their ``ping`` memory reports).

Linux only (``/proc``); used by ``benchmarks/scale.py`` on the standalone test cluster.

Thread-safety: :class:`MemorySampler` samples on its own thread; ``phase`` and ``close`` are
called from one other thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pyspark_kudu.spark.host.identity import DATA_ROOT_ENV
from pyspark_kudu.spark.host.tserver_client import ping
from pyspark_kudu.testing import procfs

if TYPE_CHECKING:
    from pyspark_kudu.spark.api.context import KuduContext

__all__ = ["MemorySampler", "server_reports"]

_EXECUTOR_PY = ("pyspark_kudu.spark.host.daemon", "pyspark.daemon", "pyspark/worker",
                "pyspark.worker")


def server_reports(kudu: KuduContext) -> list[dict[str, int]]:
    """Every tablet server's memory report (``ping``)."""
    secret = kudu.credential.encode()
    out = []
    for a in kudu.server_addresses().values():
        body = ping(a, secret)
        bg = body.get("background_apply") or {}
        out.append({**body["memory"], "background_entries": int(bg.get("entries", 0)),
                    "background_ms": int(1000 * float(bg.get("seconds", 0.0)))})
    return out


class _ExecutorPythons:
    """The executor Python processes of one benchmark cluster (their environment names a
    data root under ``within``: other clusters on the machine are left out), found cheaply:
    each process's command line and environment are read once, and only while a phase is
    measured (reading ``/proc`` for every process five times a second cost the benchmark's
    driver a quarter of a core, measured)."""

    def __init__(self, within: str) -> None:
        self._within = f"{DATA_ROOT_ENV}={within}".encode()
        self._known: dict[int, bool] = {}  # pid -> is one of ours
        self._lock = threading.Lock()  # the sampler and the phase's caller both look

    def _ours(self, pid: int) -> bool:
        raw = procfs.cmdline(pid)
        if raw is None:
            return False
        try:
            argv = raw.split(b"\0")
            cmd = b" ".join(argv).decode(errors="replace")
            # Python processes only: the executor JVMs carry the daemon's module name in
            # their -D options.
            if "python" not in os.path.basename(argv[0].decode(errors="replace")) or not any(
                    k in cmd for k in _EXECUTOR_PY):
                return False
            with open(f"/proc/{pid}/environ", "rb") as f:
                return self._within in f.read()
        except (OSError, IndexError):
            return False

    def pids(self) -> list[int]:
        me = os.getpid()
        live = set(procfs.pids()) - {me}
        with self._lock:
            for gone in set(self._known) - live:
                del self._known[gone]
            for pid in live - set(self._known):
                self._known[pid] = self._ours(pid)
            return [pid for pid, ours in self._known.items() if ours]

    def reset_peaks(self) -> None:
        """Reset each process's peak RSS (``VmHWM``), so that the next reading is the
        phase's own peak, short spikes between samples included (best effort: needs the
        right to write ``clear_refs``)."""
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                continue

    def memory(self, with_pss: bool) -> list[tuple[str, int, int]]:
        """(role, peak RSS, PSS) in bytes of each process. Role: "server" for a resident
        tablet server (a gRPC server: many threads), else "worker" (the daemon and its
        workers). Peak RSS is the larger of ``VmRSS`` and ``VmHWM`` (since
        :meth:`reset_peaks`); PSS splits pages shared after fork() (0 unless ``with_pss``:
        ``smaps_rollup`` walks the process's page tables)."""
        out = []
        for pid in self.pids():
            try:
                rss = threads = 0
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith(("VmRSS:", "VmHWM:")):
                            rss = max(rss, int(line.split()[1]) * 1024)
                        elif line.startswith("Threads:"):
                            threads = int(line.split()[1])
                pss = 0
                if with_pss:
                    with open(f"/proc/{pid}/smaps_rollup") as f:
                        for line in f:
                            if line.startswith("Pss:"):
                                pss = int(line.split()[1]) * 1024
                                break
                out.append(("server" if threads >= 8 else "worker", rss, pss))
            except (OSError, ValueError, IndexError):
                continue
        return out


class MemorySampler:
    """Peak executor-Python RSS per named phase (a background thread samples /proc while a
    phase runs), and at the end of each phase what the tablet servers say they hold
    (``report``: their ``ping`` memory reports; the largest of each figure is kept)."""

    def __init__(self, within: str, period_s: float = 0.25,
                 report: Callable[[], list[dict[str, int]]] | None = None,
                 pss_every: int = 4) -> None:
        self._procs = _ExecutorPythons(within)
        self.report = report
        self.phases: dict[str, dict[str, float]] = {}
        self._current: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._period = period_s
        self._pss_every = max(1, pss_every)
        self._thread.start()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self._period):
            with self._lock:
                if self._current is None:
                    continue
            with_pss = tick % self._pss_every == 0
            tick += 1
            procs = self._procs.memory(with_pss)
            with self._lock:
                if self._current is None or not procs:
                    continue
                p = self.phases[self._current]
                for role in ("server", "worker"):
                    rss = [r for k, r, _ in procs if k == role]
                    if rss:
                        key = f"max_{role}_rss_mb"
                        p[key] = max(p.get(key, 0.0), max(rss) / 2**20)
                p["max_process_mb"] = max(p["max_process_mb"], max(r for _, r, _ in procs) / 2**20)
                if with_pss:
                    p["max_total_pss_mb"] = max(p["max_total_pss_mb"],
                                                sum(q for _, _, q in procs) / 2**20)
                p["processes"] = max(p["processes"], len(procs))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self._lock:
            self.phases.setdefault(name, {"max_process_mb": 0.0, "max_total_pss_mb": 0.0,
                                          "processes": 0})
        self._procs.reset_peaks()
        with self._lock:
            self._current = name
        try:
            yield
        finally:
            with self._lock:
                self._current = None
            self._server_report(name)

    def _server_report(self, name: str) -> None:
        try:
            reports = self.report() if self.report is not None else []
        except Exception as e:  # a server gone: the phase keeps its sampled figures
            print(f"  (server memory reports failed: {e})", flush=True)
            return
        if not reports:
            return
        p = self.phases[name]
        for key, field in (("servers_rss_after_mb", "rss_bytes"),
                           ("servers_arrow_after_mb", "arrow_bytes"),
                           ("servers_held_after_mb", None),
                           ("servers_budget_mb", "budget_bytes")):
            got = max((r["memrowset_bytes"] + r["index_bytes"]) if field is None
                      else r[field] for r in reports) / 2**20
            p[key] = max(p.get(key, 0.0), got)
        p["servers_open_replicas_after"] = max(
            p.get("servers_open_replicas_after", 0),
            max(r["open_replicas"] for r in reports))
        # Entries the servers' background appliers applied so far, and their seconds (all
        # servers, since the cluster started: spark/host/background_apply).
        p["servers_background_entries"] = sum(r.get("background_entries", 0) for r in reports)
        p["servers_background_apply_s"] = round(
            sum(r.get("background_ms", 0) for r in reports) / 1000, 1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
