"""The fault run's report: ``report.json`` (what ran, what happened, what the checker found)
and ``timeline.png`` (faults per host, acknowledged throughput, replication state).

``report.json`` keys: ``config``, ``seed``, ``schedule`` (the planned faults, replayable with
``--replay``), ``faults`` (what was applied, with actual start and end times), ``counts``
(ops by kind and outcome), ``checker`` (verdict, violations with key, ops and explanation,
inconclusive keys), ``replication`` (time from the end of the faults to full replication,
or ``"not restored"``, and the ksck samples summary), ``replay`` (the command line) and
``notes``.

Times are seconds since the history started (the ops' time base).

Thread-safety: functions only; matplotlib is used with the Agg backend through its
object-oriented API (no pyplot global state).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark_kudu.tools.faults.checker import CheckResult
from pyspark_kudu.tools.faults.history import Op

__all__ = ["NOT_RESTORED", "op_counts", "plot_timeline", "write_report"]

NOT_RESTORED = "not restored"


def op_counts(ops: Sequence[Op]) -> dict[str, Any]:
    """Ops by kind and outcome, plus totals."""
    by: Counter[tuple[str, str]] = Counter((o.kind, o.outcome) for o in ops)
    kinds = sorted({k for k, _ in by})
    return {
        "total": len(ops),
        "by_kind": {k: {oc: by[(k, oc)] for oc in ("ok", "fail", "info") if by[(k, oc)]}
                    for k in kinds},
        "by_outcome": dict(Counter(o.outcome for o in ops)),
        "acknowledged_writes": sum(1 for o in ops if o.is_write and o.outcome == "ok"),
        "rows_rejected": sum(len(o.row_errors) for o in ops),
    }


def write_report(outdir: Path, *, config: Mapping[str, Any], seed: int,
                 schedule: Sequence[Mapping[str, Any]], faults: Sequence[Mapping[str, Any]],
                 ops: Sequence[Op], result: CheckResult | None,
                 samples: Sequence[Mapping[str, Any]], faults_end: float | None,
                 restored_after_s: float | None, replay: str,
                 notes: Sequence[str] = (), extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``report.json`` and ``timeline.png`` under ``outdir``; returns the JSON path."""
    outdir.mkdir(parents=True, exist_ok=True)
    under = [s for s in samples if s.get("under_replicated") or s.get("unavailable")]
    report: dict[str, Any] = {
        "config": dict(config),
        "seed": seed,
        "schedule": list(schedule),
        "faults": list(faults),
        "counts": op_counts(ops),
        "checker": result.to_dict() if result is not None else {"valid": None,
                                                                  "violations": []},
        "replication": {
            "faults_end_s": faults_end,
            "time_to_full_replication_s": (NOT_RESTORED if restored_after_s is None
                                           else round(restored_after_s, 2)),
            "samples": len(samples),
            "samples_not_fully_replicated": len(under),
            "max_under_replicated": max((int(s.get("under_replicated", 0)) for s in samples),
                                        default=0),
            "max_unavailable": max((int(s.get("unavailable", 0)) for s in samples), default=0),
        },
        "replay": replay,
        "notes": list(notes),
        **(extra or {}),
    }
    path = outdir / "report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=False, default=str) + "\n",
                    encoding="utf-8")
    plot_timeline(outdir / "timeline.png", faults, ops, samples, faults_end,
                  None if restored_after_s is None or faults_end is None
                  else faults_end + restored_after_s)
    return path


def plot_timeline(path: Path, faults: Sequence[Mapping[str, Any]], ops: Sequence[Op],
                  samples: Sequence[Mapping[str, Any]], faults_end: float | None,
                  restored_at: float | None) -> None:
    """Three panels over one time axis: fault spans per host, acknowledged ops per second
    (and unknown / failed outcomes), and tablets not fully replicated (ksck samples)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 8))
    FigureCanvasAgg(fig)
    ax_f, ax_t, ax_r = fig.subplots(3, 1, sharex=True,
                                    gridspec_kw={"height_ratios": [1.2, 1, 1]})
    finite = [t for o in ops for t in (o.invoke, o.complete) if not math.isinf(t)]
    end = max([*finite, *(float(s["t"]) for s in samples), 1.0])

    hosts = sorted({str(f["host"]) for f in faults})
    colors = {"kill_executor": "tab:red", "restart_worker": "tab:orange",
              "lose_host": "tab:purple", "pause_host": "tab:blue", "disk_full": "tab:brown",
              "corrupt_replica": "tab:pink"}
    for y, host in enumerate(hosts):
        for f in faults:
            if str(f["host"]) != host or f.get("start") is None:
                continue
            start = float(f["start"])
            stop = float(f["end"]) if f.get("end") is not None else end
            ax_f.broken_barh([(start, max(stop - start, 0.3))], (y - 0.35, 0.7),
                             color=colors.get(str(f["kind"]), "tab:gray"))
            ax_f.text(start, y + 0.38, str(f["kind"]), fontsize=7, va="bottom")
    ax_f.set_yticks(range(len(hosts)), hosts)
    ax_f.set_ylim(-0.8, max(len(hosts), 1) - 0.2)
    ax_f.set_title("faults per host (span: host without its executor / worker)")

    seconds = int(end) + 1
    acked = [0] * seconds
    unknown = [0] * seconds
    failed = [0] * seconds
    for o in ops:
        if math.isinf(o.complete):
            continue
        bucket = {"ok": acked, "info": unknown, "fail": failed}[o.outcome]
        bucket[min(int(o.complete), seconds - 1)] += 1
    xs = list(range(seconds))
    ax_t.step(xs, acked, where="post", label="acknowledged (ok)", color="tab:green")
    ax_t.step(xs, unknown, where="post", label="unknown (info)", color="tab:orange")
    ax_t.step(xs, failed, where="post", label="failed", color="tab:red")
    ax_t.set_ylabel("ops / s")
    ax_t.legend(loc="upper right", fontsize=8)
    ax_t.set_title("throughput of completed operations")

    ts = [float(s["t"]) for s in samples]
    ax_r.step(ts, [int(s.get("under_replicated", 0)) for s in samples], where="post",
              label="under-replicated tablets", color="tab:orange")
    ax_r.step(ts, [int(s.get("unavailable", 0)) for s in samples], where="post",
              label="unavailable tablets", color="tab:red")
    ax_r.step(ts, [int(s.get("live_tservers", 0)) for s in samples], where="post",
              label="live tablet servers", color="tab:blue", alpha=0.5)
    for ax in (ax_f, ax_t, ax_r):
        if faults_end is not None:
            ax.axvline(faults_end, color="black", linestyle="--", linewidth=0.8)
        if restored_at is not None:
            ax.axvline(restored_at, color="tab:green", linestyle=":", linewidth=1.2)
    ax_r.set_ylabel("count")
    ax_r.set_xlabel("seconds since the workload started (dashed: faults end; dotted: full "
                    "replication restored)")
    ax_r.legend(loc="upper right", fontsize=8)
    ax_r.set_title("replication state (ksck, sampled every second)")
    fig.tight_layout()
    fig.savefig(str(path), dpi=90)
