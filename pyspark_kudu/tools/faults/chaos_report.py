"""The chaos part of a fault run's report (:mod:`.chaos`): ``report.json``'s ``chaos`` key and
``writes.png``.

``chaos`` holds the kills (``kills``), the chaos writes attempted / acknowledged / failed
(``writes``), ``acknowledged_fraction`` against ``goal`` (``goal_met``), the per-write latency
distribution (``latency_s``: ``acknowledged``, ``failed`` and ``all``, each with ``n``,
``p50``, ``p90``, ``p99``, ``max``, ``mean``, a ``histogram`` and the ``sorted`` latencies),
and for every chaos write that raised (``failed_writes``): when it ran, what it raised
(exception type, Spark's error condition, the project error and the first line of its
message) and its timing against the kills: the kills during the write (seconds after it was
invoked), the last kill before it was invoked, the kill nearest to the moment it raised
(``offset_s`` < 0: that many seconds before it) and the hosts whose killed executor had no
successor yet at that moment. ``reads`` counts the chaos reads and lists
the error of every read that failed (chaos and final reads, each with its ``client``), with
the driver's view of the tablet servers at that moment (``tservers``: the address reads are
planned with, whether it answers, the host's executors now and when it was learnt).

Latency is from the invocation of ``save()`` to its return or its exception, in seconds.
Percentiles are nearest-rank. Times are seconds since the history started.

Thread-safety: functions only; matplotlib through its object-oriented API (no pyplot).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark_kudu.tools.faults.history import Op

__all__ = ["HISTOGRAM_EDGES_S", "chaos_summary", "distribution", "goal_line", "log_lines",
           "plot_writes"]

HISTOGRAM_EDGES_S: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0,
                                        89.0, 144.0)
"""Upper bounds of the latency histogram's bins (the last bin is everything above)."""


def _rank(xs: Sequence[float], p: float) -> float:
    return xs[max(0, math.ceil(p / 100.0 * len(xs)) - 1)]


def distribution(latencies: Sequence[float]) -> dict[str, Any]:
    """n, p50, p90, p99, max, min, mean, a histogram over :data:`HISTOGRAM_EDGES_S` and the
    sorted values (seconds, rounded to ms); the statistics are None when empty."""
    xs = sorted(latencies)
    bins = Counter(next((f"<= {e:g}" for e in HISTOGRAM_EDGES_S if x <= e),
                        f"> {HISTOGRAM_EDGES_S[-1]:g}") for x in xs)
    labels = [f"<= {e:g}" for e in HISTOGRAM_EDGES_S] + [f"> {HISTOGRAM_EDGES_S[-1]:g}"]
    stats: dict[str, Any] = {"n": len(xs)}
    for name, p in (("p50", 50.0), ("p90", 90.0), ("p99", 99.0)):
        stats[name] = round(_rank(xs, p), 3) if xs else None
    stats.update({
        "max": round(xs[-1], 3) if xs else None,
        "min": round(xs[0], 3) if xs else None,
        "mean": round(sum(xs) / len(xs), 3) if xs else None,
        "histogram": [{"bin_s": b, "count": bins[b]} for b in labels if bins[b]],
        "sorted": [round(x, 3) for x in xs],
    })
    return stats


def _kills(faults: Sequence[Mapping[str, Any]]) -> list[tuple[float, str]]:
    return sorted((float(f["start"]), str(f["host"])) for f in faults
                  if f.get("kind") == "kill_executor" and f.get("start") is not None)


def _timing(op: Op, kills: Sequence[tuple[float, str]],
            faults: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A failed write's timing against the kills, and the hosts whose killed executor had no
    successor yet when it raised (a kill's span: from the kill to a new executor there)."""
    during = [{"host": h, "at_s": round(t, 2), "after_invoke_s": round(t - op.invoke, 2)}
              for t, h in kills if op.invoke <= t <= op.complete]
    before = [(t, h) for t, h in kills if t < op.invoke]
    down = sorted({str(f["host"]) for f in faults
                   if f.get("start") is not None and float(f["start"]) <= op.complete
                   and (f.get("end") is None or float(f["end"]) > op.complete)})
    out: dict[str, Any] = {"kills_during": during, "last_kill_before_invoke": None,
                           "nearest_kill_to_raise": None,
                           "hosts_without_executor_at_raise": down}
    if before:
        t, h = before[-1]
        out["last_kill_before_invoke"] = {"host": h, "at_s": round(t, 2),
                                          "before_invoke_s": round(op.invoke - t, 2)}
    if kills and not math.isinf(op.complete):
        t, h = min(kills, key=lambda k: abs(k[0] - op.complete))
        out["nearest_kill_to_raise"] = {"host": h, "at_s": round(t, 2),
                                        "offset_s": round(t - op.complete, 2)}
    return out


def chaos_summary(ops: Sequence[Op], faults: Sequence[Mapping[str, Any]], *,
                  chaos_ops: Sequence[int], chaos_start: float | None,
                  chaos_end: float | None, write_errors: Mapping[int, Mapping[str, Any]],
                  read_errors: Sequence[Mapping[str, Any]], goal: float, period_s: float,
                  rows: int) -> dict[str, Any]:
    """The ``chaos`` key of ``report.json`` (see the module docstring). ``chaos_ops``: the
    op ids of the chaos writes; ``write_errors``: op id -> :class:`.chaos.ErrorInfo` dict."""
    by_id = {o.id: o for o in ops}
    writes = [by_id[i] for i in chaos_ops if i in by_id]
    kills = _kills(faults)
    outcomes: Counter[str] = Counter()
    failed = []
    for n, op in enumerate(writes, 1):
        err = write_errors.get(op.id)
        if op.outcome == "ok":
            outcomes["acknowledged"] += 1
            continue
        kind = ("never completed" if math.isinf(op.complete) else
                "unexpected" if err is None or err.get("outcome") is None else
                str(err["outcome"]))
        outcomes[kind] += 1
        failed.append({
            "op": op.id, "write": n, "invoke_s": round(op.invoke, 2),
            "complete_s": None if math.isinf(op.complete) else round(op.complete, 2),
            "latency_s": None if math.isinf(op.complete) else round(op.complete - op.invoke, 3),
            "outcome": kind,
            **({k: err.get(k) for k in ("raised", "condition", "error", "message")}
               if err else {"raised": None, "condition": None, "error": None,
                            "message": op.error}),
            **_timing(op, kills, faults),
        })
    acked = outcomes["acknowledged"]
    finite = [o for o in writes if not math.isinf(o.complete)]
    chaos_reads = [o for o in ops if o.kind == "read" and not o.client.startswith("reader")
                   and chaos_start is not None and o.invoke >= chaos_start
                   and (chaos_end is None or o.invoke <= chaos_end)]
    fraction = acked / len(writes) if writes else None
    return {
        "period_s": period_s, "rows_per_write": rows,
        "start_s": None if chaos_start is None else round(chaos_start, 2),
        "end_s": None if chaos_end is None else round(chaos_end, 2),
        "kills": {"applied": len(kills), "scheduled": len(faults),
                  "per_host": dict(Counter(h for _, h in kills))},
        "writes": {"attempted": len(writes), "acknowledged": acked,
                   "failed": len(writes) - acked,
                   "by_outcome": dict(outcomes)},
        "acknowledged_fraction": None if fraction is None else round(fraction, 4),
        "goal": goal,
        "goal_met": fraction is not None and fraction >= goal,
        "latency_s": {
            "acknowledged": distribution([o.complete - o.invoke for o in finite
                                          if o.outcome == "ok"]),
            "failed": distribution([o.complete - o.invoke for o in finite if o.outcome != "ok"]),
            "all": distribution([o.complete - o.invoke for o in finite]),
        },
        "failed_writes": failed,
        "reads": {"attempted": len(chaos_reads),
                  "ok": sum(1 for o in chaos_reads if o.outcome == "ok"),
                  "failed": sum(1 for o in chaos_reads if o.outcome != "ok"),
                  "errors": list(read_errors)},
    }


def goal_line(summary: Mapping[str, Any]) -> str:
    """One line for the log: the acknowledged share against the goal, and the latencies."""
    w = summary["writes"]
    frac = summary["acknowledged_fraction"]
    lat = summary["latency_s"]["acknowledged"]
    share = "n/a" if frac is None else f"{frac:.1%}"
    verdict = "met" if summary["goal_met"] else "NOT MET"
    lat_text = ("no write acknowledged" if not lat["n"] else
                f"acknowledged latency p50 {lat['p50']:.2f} s, p90 {lat['p90']:.2f} s, "
                f"p99 {lat['p99']:.2f} s, max {lat['max']:.2f} s")
    return (f"CHAOS: {w['acknowledged']} of {w['attempted']} writes acknowledged ({share}), "
            f"{w['failed']} failed {w['by_outcome']}; goal >= {summary['goal']:.0%}: "
            f"{verdict} (a measurement: it does not change the exit code); "
            f"{summary['kills']['applied']} kills; {lat_text}")


def log_lines(summary: Mapping[str, Any]) -> list[str]:
    """The failed writes, one line each, then :func:`goal_line`."""
    out = []
    for f in summary["failed_writes"]:
        via = f"{f['raised']}" + (f" {f['condition']}" if f["condition"] else "")
        out.append(f"chaos write #{f['write']} (op {f['op']}) {f['outcome']} after "
                   f"{f['latency_s']} s: {f['error']}: {f['message']} [raised as {via}]; "
                   f"kills during it: {[k['host'] for k in f['kills_during']]}; nearest kill "
                   f"to the raise: {f['nearest_kill_to_raise']}; hosts without an executor "
                   f"then: {f['hosts_without_executor_at_raise']}")
    return [*out, goal_line(summary)]


def plot_writes(path: Path, ops: Sequence[Op], chaos_ops: Sequence[int],
                faults: Sequence[Mapping[str, Any]]) -> None:
    """Each chaos write (numbered from 1, as in ``failed_writes``) as a bar from invocation
    to completion (green acknowledged, orange unknown, red failed / unexpected), the read
    after it as a thin bar (grey ok, black failed), the kills as vertical lines named by
    the host's last octet."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_id = {o.id: o for o in ops}
    writes = [by_id[i] for i in chaos_ops if i in by_id]
    kills = _kills(faults)
    fig = Figure(figsize=(11, max(3.0, 0.18 * len(writes) + 1.5)))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    end = max([o.complete for o in ops if not math.isinf(o.complete)]
              + [t for t, _ in kills] + [1.0])
    colors = {"ok": "tab:green", "info": "tab:orange", "fail": "tab:red"}
    for n, o in enumerate(writes, 1):
        stop = end if math.isinf(o.complete) else o.complete
        color = "tab:red" if o.error.startswith("unexpected") else colors[o.outcome]
        ax.broken_barh([(o.invoke, max(stop - o.invoke, 0.05))], (n - 0.4, 0.8), color=color)
        nxt = writes[n].invoke if n < len(writes) else math.inf
        for r in ops:
            if r.kind == "read" and r.client == o.client and stop <= r.invoke < nxt:
                r_end = end if math.isinf(r.complete) else r.complete
                ax.broken_barh([(r.invoke, max(r_end - r.invoke, 0.05))], (n - 0.12, 0.24),
                               color="tab:gray" if r.outcome == "ok" else "black")
    for t, host in kills:
        ax.axvline(t, color="black", linewidth=0.7, alpha=0.6)
        ax.text(t, len(writes) + 0.7, host.rsplit(".", 1)[-1], fontsize=6, rotation=90,
                va="bottom")
    ax.set_ylim(0, len(writes) + 2.5)
    ax.set_ylabel("chaos write #")
    ax.set_xlabel("seconds since the history started (vertical lines: executor kills, "
                  "labelled by the host's last octet)")
    ax.set_title("format('kudu') writes under executor kills: green acknowledged, orange "
                 "unknown, red failed; thin: the read after it (grey ok, black failed)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(str(path), dpi=90)
