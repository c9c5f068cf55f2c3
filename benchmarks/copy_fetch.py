"""The served tablet copy's own ceiling on this machine: no Spark, no Raft, just the bytes.

``--sources`` source processes each run a resident tablet server's file stream server
(``spark/host/file_stream.py``) over one staged copy of ``size / sources`` bytes (random,
in the page cache, as a just-flushed rowset is); as many target processes each fetch one of
them at the same moment with the code a copy's ``INSTALL_COPY`` runs
(:func:`~pyspark_kudu.spark.host.copy_fetch.fetch_served_copies`: parallel segment
streams, CRC32C of every byte, each file fsynced), once with the page cache (the targets'
chunks written by ``pwrite``) and once with ``O_DIRECT`` (the default since 669256a).
The fetch is timed from the first stream opened to the last file synced.

Baselines, the same bytes in the same run:

- ``disk_recycled``: one process writes them to a new file, fsyncs and deletes it, three
  times (the median): what ``benchmarks/recovery.py`` calls this disk's fsync'd write
  bandwidth. The second and third writes reuse the page frames the first one freed;
- ``disk_fresh``: the same, keeping each file until the end: every write lands in page
  frames the guest has not touched lately, as a copy's do. On the test VM such writes ran
  at ~350 MB/s against 1.5-1.8 GB/s recycled (each page a fresh guest page to fault in).

Run: ``.venv/bin/python benchmarks/copy_fetch.py [--mb 200,1000] [--sources 3]``; prints
the figures and saves ``results/copy_fetch.{json,png}`` with the commit id and date. A
benchmark, never a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SECRET = "copy-fetch-benchmark-secret-0123456789"
_CHUNK = 8 << 20


def _write_random(path: str, n: int) -> None:
    with open(path, "wb") as f:
        left = n
        while left > 0:
            piece = os.urandom(min(left, _CHUNK))
            f.write(piece)
            left -= len(piece)


def _disk(directory: str, n: int, keep: bool) -> list[float]:
    """Seconds to write ``n`` bytes to a new file and fsync it, three times; ``keep``: the
    files stay until all three are written (no page frame reused)."""
    data = os.urandom(_CHUNK)
    out, kept = [], []
    for k in range(3):
        path = os.path.join(directory, f"disk-{int(keep)}-{k}")
        t = time.perf_counter()
        with open(path, "wb") as f:
            left = n
            while left > 0:
                f.write(data[:min(left, _CHUNK)])
                left -= min(left, _CHUNK)
            f.flush()
            os.fsync(f.fileno())
        out.append(time.perf_counter() - t)
        if keep:
            kept.append(path)
        else:
            os.remove(path)
    for path in kept:
        os.remove(path)
    return out


def _serve(root: str, ready: Any, stop: Any) -> None:
    from pyspark_kudu.spark.host.file_stream import FileStreamServer

    srv = FileStreamServer("127.0.0.1", SECRET.encode(),
                           lambda req: os.path.join(root, req.path))
    ready.put(srv.address)
    stop.wait()
    srv.shutdown()


def _fetch(root: str, manifest: bytes, direct: bool, go: Any, out: Any) -> None:
    os.environ["PYSPARK_KUDU_SECRET"] = SECRET
    from pyspark_kudu.fileio import FileIO
    from pyspark_kudu.spark.host import copy_fetch, copy_segments

    if not direct:
        copy_segments.open_direct = lambda path: -1  # every chunk through the page cache
    copy = copy_fetch.ServedCopy.decode(manifest)
    assert copy is not None
    go.wait()
    rep = copy_fetch.fetch_served_copies(root, [(FileIO(root), copy)])
    out.put((str(rep.errors[0] or ""), rep.started, rep.ended))


def _one(size: int, sources: int, base: str) -> dict[str, Any]:
    from pyspark_kudu.spark.host.copy_fetch import (
        COPY_OUT_DIR,
        TAIL,
        ServedCopy,
        ServedFile,
    )
    from pyspark_kudu.tablet.checksums import segment_crcs

    ctx = mp.get_context("spawn")
    r: dict[str, Any] = {"bytes": size, "sources": sources}
    work = tempfile.mkdtemp(prefix="bench-copy-fetch-", dir=base)
    try:
        r["disk_recycled_s"] = _disk(work, size, keep=False)
        r["disk_fresh_s"] = _disk(work, size, keep=True)
        stop, ready = ctx.Event(), ctx.Queue()
        manifests, servers = [], []
        for k in range(sources):
            root = os.path.join(work, f"src{k}")
            staged = os.path.join(root, COPY_OUT_DIR, "c1")
            os.makedirs(os.path.join(staged, "files"))
            _write_random(os.path.join(staged, "files", "rowset"), size // sources)
            _write_random(os.path.join(staged, TAIL), 4096)
            p = ctx.Process(target=_serve, args=(root, ready, stop))
            p.start()
            servers.append(p)
            files = (ServedFile(TAIL, 4096, segment_crcs(os.path.join(staged, TAIL))),
                     ServedFile("rowset", size // sources,
                                segment_crcs(os.path.join(staged, "files", "rowset"))))
            manifests.append(ServedCopy("-", f"ts{k}", root, "t", "c1", files,
                                        ready.get(timeout=60)).encode())
        for direct in (False, True):
            go, out = ctx.Event(), ctx.Queue()
            procs = []
            for k in range(sources):
                target = os.path.join(work, f"{'direct' if direct else 'buffered'}{k}")
                p = ctx.Process(target=_fetch,
                                args=(target, manifests[(k + 1) % sources], direct, go, out))
                p.start()
                procs.append(p)
            time.sleep(2.0)  # every fetcher imported and waiting: one start for all
            go.set()
            got = [out.get(timeout=600) for _ in procs]
            for p in procs:
                p.join()
            errors = [e for e, _, _ in got if e]
            if errors:
                raise SystemExit(f"a fetch failed: {errors[0]}")
            key = "direct" if direct else "buffered"
            r[f"fetch_{key}_s"] = max(e for _, _, e in got) - min(s for _, s, _ in got)
        stop.set()
        for p in servers:
            p.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for key in ("disk_recycled", "disk_fresh"):
        r[f"{key}_bytes_per_s"] = size / statistics.median(r[f"{key}_s"])
    for key in ("buffered", "direct"):
        bps = size / r[f"fetch_{key}_s"]
        r[f"fetch_{key}_bytes_per_s"] = bps
        r[f"{key}_vs_disk_recycled"] = bps / r["disk_recycled_bytes_per_s"]
        r[f"{key}_vs_disk_fresh"] = bps / r["disk_fresh_bytes_per_s"]
    return r


def main(argv: list[str] | None = None) -> int:
    from pyspark_kudu.testing.benchdata import commit_id

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="200,1000", help="copy sizes in MB, comma-separated")
    ap.add_argument("--sources", type=int, default=3,
                    help="source servers and as many fetching processes (tablets copied "
                         "together)")
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="where the files go (the disk measured)")
    args = ap.parse_args(argv)
    r: dict[str, Any] = {
        "commit": commit_id(REPO),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "runs": []}
    for mb in (float(x) for x in args.mb.split(",")):
        run = _one(int(mb * 1e6), args.sources, args.dir)
        r["runs"].append(run)
        print(f"{mb:.0f} MB from {args.sources} servers: fetch through the page cache "
              f"{run['fetch_buffered_s']:.2f} s, with O_DIRECT {run['fetch_direct_s']:.2f} s; "
              f"disk write + fsync {statistics.median(run['disk_recycled_s']):.2f} s "
              f"(recycled pages), {statistics.median(run['disk_fresh_s']):.2f} s (fresh) -> "
              f"buffered {run['buffered_vs_disk_recycled']:.2f}x, O_DIRECT "
              f"{run['direct_vs_disk_recycled']:.2f}x of the recycled-page write "
              f"({run['buffered_vs_disk_fresh']:.2f}x / {run['direct_vs_disk_fresh']:.2f}x "
              f"of the fresh one)")
    _save(r)
    return 0


def _save(r: dict[str, Any]) -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "copy_fetch.json").write_text(json.dumps(r, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = r["runs"]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.2
    series = [("fetch_buffered_bytes_per_s", "fetch, page cache", "tab:cyan"),
              ("fetch_direct_bytes_per_s", "fetch, O_DIRECT", "tab:blue"),
              ("disk_recycled_bytes_per_s", "disk write + fsync (recycled pages)", "tab:gray"),
              ("disk_fresh_bytes_per_s", "disk write + fsync (fresh pages)", "silver")]
    for k, (key, label, color) in enumerate(series):
        ax.bar([p + (k - 1.5) * width for p in range(len(runs))],
               [x[key] / 1e6 for x in runs], width, label=label, color=color)
    for p, x in enumerate(runs):
        ax.annotate(f"{x['direct_vs_disk_recycled']:.2f}x",
                    (p - 0.5 * width, x["fetch_direct_bytes_per_s"] / 1e6),
                    ha="center", va="bottom")
    ax.set_xticks(range(len(runs)), [f"{x['bytes'] / 1e6:.0f} MB, {x['sources']} copies"
                                     for x in runs])
    ax.set_ylabel("MB/s")
    ax.legend(fontsize=8)
    ax.set_title(f"served tablet copy without Spark, commit {r['commit'][:10]}, "
                 f"{r['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "copy_fetch.png", dpi=120)
    print(f"saved {RESULTS_DIR / 'copy_fetch.json'} and .png")


if __name__ == "__main__":
    sys.exit(main())
