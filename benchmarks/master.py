"""Catalog writes on a 3-process master quorum vs etcd 3.4 puts of the same size.

Both systems run as 3 members on loopback, both sync their log before acknowledging
(pyspark-kudu: WAL ``fdatasync``; etcd 3.4: its WAL always fdatasyncs and has no switch to
turn it off), and both are driven by the same load: ``--procs`` client processes with
``--threads`` threads each, every thread issuing one synchronous write after another for
``--seconds`` seconds against the leader.

- pyspark-kudu: ``CreateTable`` (one tablet, replication factor 3) through ``MasterClient``
  over Arrow Flight. Each is one catalog entry; its size is measured and reported.
- etcd: ``PUT`` through the v3 JSON gateway (``POST /v3/kv/put``) over keep-alive HTTP,
  values as large as that catalog entry.

Prints and saves (``benchmarks/results/master.json`` + ``.png``) writes/s, p50 and p99
latency of each, and the ratio pyspark-kudu / etcd (goal >= 0.3x). This VM's fsync is
implausibly fast (DESIGN §4): compare the ratio, not absolute durability numbers.

Usage: ``.venv/bin/python benchmarks/master.py [--seconds 10] [--procs 2] [--threads 8]``.
etcd comes from the Debian package ``etcd-server`` (``apt-get install -y etcd-server``);
without it the etcd half is skipped with a message and no ratio is claimed.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.ddl import build_create_table
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.localcluster import MasterProcessCluster, free_ports
from pyspark_kudu.master.records import encode_record
from pyspark_kudu.schema import ColumnSchema, Schema

SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("ts", "int64"),
                 ColumnSchema("host", "string"), ColumnSchema("value", "double")), ("id",))
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# -- load generation (runs in client processes) ----------------------------------------------


def _drive(make_op: Callable[[int, int], Callable[[int], None]], proc: int, threads: int,
           seconds: float) -> tuple[list[float], int]:
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    start = time.monotonic() + 0.2
    end = start + seconds

    def worker(t: int) -> None:
        op = make_op(proc, t)
        mine: list[float] = []
        i = 0
        while time.monotonic() < start:
            time.sleep(0.001)
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                op(i)
                mine.append(time.perf_counter() - t0)
            except Exception:
                with lock:
                    errors[0] += 1
            i += 1
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    return lat, errors[0]


def kudu_proc(masters: str, proc: int, threads: int, seconds: float) -> tuple[list[float], int]:
    client = MasterClient(masters, timeout_s=30)
    client.leader_address()

    def make(p: int, t: int) -> Callable[[int], None]:
        def op(i: int) -> None:
            client.create_table(f"bench_{p}_{t}_{i}", SCHEMA, replication_factor=3)

        return op

    return _drive(make, proc, threads, seconds)


def etcd_proc(endpoint: str, value_size: int, proc: int, threads: int,
              seconds: float) -> tuple[list[float], int]:
    host, port = endpoint.rsplit(":", 1)
    value = base64.b64encode(os.urandom(value_size)).decode()

    def make(p: int, t: int) -> Callable[[int], None]:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)

        def op(i: int) -> None:
            key = base64.b64encode(f"/catalog/bench_{p}_{t}_{i}".encode()).decode()
            conn.request("POST", "/v3/kv/put", json.dumps({"key": key, "value": value}),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"etcd put: HTTP {r.status}")

        return op

    return _drive(make, proc, threads, seconds)


def _run_load(target: Callable[..., tuple[list[float], int]], args: tuple[Any, ...],
              procs: int, threads: int, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        t0 = time.monotonic()
        parts = pool.starmap(target, [(*args, p, threads, seconds) for p in range(procs)])
        wall = time.monotonic() - t0
    lat = np.array([x for part in parts for x in part[0]])
    errors = sum(part[1] for part in parts)
    return {
        "ops": int(lat.size), "errors": int(errors), "seconds": seconds,
        "writes_per_s": float(lat.size / seconds),
        "p50_ms": float(np.percentile(lat, 50) * 1e3) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat.size else None,
        "wall_s": wall,
    }


# -- the two systems -------------------------------------------------------------------------


def record_size() -> int:
    """Bytes of the catalog entry one benchmark CreateTable writes."""
    from pyspark_kudu.master.catalog import Catalog, apply
    from pyspark_kudu.master.records import RegisterTServer

    cat = Catalog()
    for i in range(3):
        cat = apply(cat, RegisterTServer(TServerMeta(f"ts{i}", f"127.0.0.{i + 2}", 7050,
                                                     f"/data/ts{i}")), i + 1)
    rec = build_create_table(cat, name="bench_0_0_0", schema=SCHEMA, partition_schema=None,
                             replication_factor=3, constraint=None, live=set(cat.tservers),
                             rng=random.Random(0))
    return len(encode_record(rec))


def bench_kudu(root: str, a: argparse.Namespace) -> dict[str, Any]:
    with MasterProcessCluster(os.path.join(root, "kudu"), 3, fsync=a.fsync) as cluster:
        cluster.start()
        cluster.wait_for_leader(60)
        with cluster.client(timeout_s=30) as c:
            for i in range(3):
                for addr in cluster.peers.values():
                    c.heartbeat_to(addr, TServerMeta(f"ts{i}", f"127.0.0.{i + 2}", 7050,
                                                     f"/data/ts{i}"))
            for i in range(20):  # warm-up
                c.create_table(f"warmup_{i}", SCHEMA, replication_factor=3)
        return _run_load(kudu_proc, (cluster.master_addresses,), a.procs, a.threads, a.seconds)


class EtcdCluster:
    """Three etcd members on loopback; kills only the processes it started."""

    def __init__(self, root: str) -> None:
        ports = free_ports(6)
        self.client = [f"127.0.0.1:{p}" for p in ports[:3]]
        self.peer = [f"127.0.0.1:{p}" for p in ports[3:]]
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        initial = ",".join(f"e{i}=http://{p}" for i, p in enumerate(self.peer))
        for i in range(3):
            d = os.path.join(self.root, f"e{i}")
            log = open(d + ".log", "wb")
            self.procs.append(subprocess.Popen([
                "etcd", "--name", f"e{i}", "--data-dir", d,
                "--listen-client-urls", f"http://{self.client[i]}",
                "--advertise-client-urls", f"http://{self.client[i]}",
                "--listen-peer-urls", f"http://{self.peer[i]}",
                "--initial-advertise-peer-urls", f"http://{self.peer[i]}",
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", "bench", "--log-level", "error", "--logger", "zap",
            ], stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            log.close()

    def leader_endpoint(self, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for ep in self.client:
                try:
                    st = _post(ep, "/v3/maintenance/status", {})
                except OSError:
                    continue
                if st.get("leader") and st["leader"] == st["header"]["member_id"]:
                    return ep
            time.sleep(0.2)
        raise TimeoutError(f"etcd elected no leader within {timeout:.0f} s (logs in {self.root})")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def _post(endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=2)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        out: dict[str, Any] = json.loads(conn.getresponse().read() or b"{}")
        return out
    finally:
        conn.close()


def bench_etcd(root: str, a: argparse.Namespace, value_size: int) -> dict[str, Any] | None:
    if shutil.which("etcd") is None:
        print("etcd not found: install etcd 3.4 (Debian: apt-get install -y etcd-server) to "
              "measure the ratio; reporting pyspark-kudu alone")
        return None
    version = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout
    cluster = EtcdCluster(os.path.join(root, "etcd"))
    os.makedirs(cluster.root, exist_ok=True)
    try:
        cluster.start()
        leader = cluster.leader_endpoint()
        out = _run_load(etcd_proc, (leader, value_size), a.procs, a.threads, a.seconds)
        out["version"] = version.splitlines()[0] if version else "unknown"
        return out
    finally:
        cluster.stop()


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in ("pyspark_kudu", "etcd") if result.get(s)]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].bar(systems, [result[s]["writes_per_s"] for s in systems], color=["C0", "C1"])
    axes[0].set_title("writes/s (higher is better)")
    x = np.arange(len(systems))
    axes[1].bar(x - 0.2, [result[s]["p50_ms"] for s in systems], 0.4, label="p50")
    axes[1].bar(x + 0.2, [result[s]["p99_ms"] for s in systems], 0.4, label="p99")
    axes[1].set_xticks(x, systems)
    axes[1].set_title("latency ms (lower is better)")
    axes[1].legend()
    ratio = result.get("ratio_writes")
    fig.suptitle(f"3-master catalog vs etcd, {result['inputs']['record_bytes']} B writes"
                 + (f": ratio {ratio:.2f}x" if ratio else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--procs", type=int, default=2, help="client processes")
    p.add_argument("--threads", type=int, default=8, help="threads per client process")
    p.add_argument("--fsync", default="fdatasync", choices=["fdatasync", "fsync"])
    p.add_argument("--out", default=RESULTS)
    a = p.parse_args(argv)
    size = record_size()
    root = tempfile.mkdtemp(prefix="bench-master-")
    try:
        kudu = bench_kudu(root, a)
        print(f"pyspark-kudu: {kudu['writes_per_s']:.0f} writes/s, p50 {kudu['p50_ms']:.2f} ms, "
              f"p99 {kudu['p99_ms']:.2f} ms ({kudu['errors']} errors)")
        etcd = bench_etcd(root, a, size)
        if etcd:
            print(f"etcd:         {etcd['writes_per_s']:.0f} writes/s, p50 {etcd['p50_ms']:.2f} "
                  f"ms, p99 {etcd['p99_ms']:.2f} ms ({etcd['errors']} errors)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {
        "benchmark": "master catalog writes vs etcd puts",
        "inputs": {"record_bytes": size, "seconds": a.seconds, "client_procs": a.procs,
                   "threads_per_proc": a.threads, "masters": 3, "etcd_members": 3,
                   "fsync": a.fsync, "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "pyspark_kudu": kudu, "etcd": etcd,
        "ratio_writes": kudu["writes_per_s"] / etcd["writes_per_s"] if etcd else None,
        "ratio_p50_latency": etcd["p50_ms"] / kudu["p50_ms"] if etcd else None,
        "goal_ratio": 0.3,
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "master.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    plot(result, os.path.join(a.out, "master.png"))
    if result["ratio_writes"] is not None:
        print(f"ratio (pyspark-kudu / etcd writes/s): {result['ratio_writes']:.2f}x "
              f"(goal >= 0.3x); record {size} B; results in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
