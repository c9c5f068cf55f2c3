"""Start and stop a Spark standalone cluster whose workers bind to distinct loopback hosts.

Used by the ``cluster`` test fixture, the benchmarks and ``conf/test-cluster.sh``. The shape
follows DESIGN §4: a master on 127.0.0.1 (REST server disabled) and one worker per host
127.0.0.2..N+1, each with ``SPARK_LOCAL_IP`` set (so its RPC and web UI bind to that loopback
address only), 1 core, a small memory budget, and its own tablet-server data root exported as
``PYSPARK_KUDU_DATA_ROOT`` (executors inherit the worker's environment).

Only processes this object started are ever signalled: each daemon runs in its own process
group and :meth:`StandaloneCluster.stop` kills exactly those groups.

Thread-safety: not thread-safe; one owner starts and stops a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark_kudu.errors import TimedOutError
from pyspark_kudu.spark.host.identity import DATA_ROOT_ENV

__all__ = ["StandaloneCluster", "WorkerSpec", "cluster_session", "spark_home"]


def spark_home() -> str:
    """The Spark distribution bundled with the installed pyspark."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _wait_for(predicate: object, deadline_s: float, what: str, poll_s: float = 0.2) -> None:
    assert callable(predicate)
    end = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while time.monotonic() < end:
        try:
            if predicate():
                return
        except (OSError, ValueError) as e:
            # not up yet: refused or reset, or (ValueError) the master's web UI answered
            # before its JSON handler was ready (an empty body; seen once in CI)
            last_error = e
        time.sleep(poll_s)
    raise TimedOutError(f"{what} did not happen within {deadline_s:.0f} s"
                        + (f" (last error: {last_error})" if last_error else ""))


@dataclass
class WorkerSpec:
    host: str
    data_root: Path
    work_dir: Path
    log: Path
    webui_port: int
    process: subprocess.Popen[bytes] | None = None


@dataclass
class StandaloneCluster:
    """A master plus ``workers`` workers on 127.0.0.2.. under ``base_dir``.

    ``cores`` and ``memory`` are per worker. ``python`` is the interpreter executors use.
    ``data_roots`` overrides the data root of some hosts: a second cluster whose workers
    share the first one's roots serves the same tablet servers to a second application
    (two writers, each with its own executors on every host).
    """

    base_dir: Path
    workers: int = 6
    cores: int = 1
    memory: str = "1g"
    first_host: int = 2
    python: str = sys.executable
    daemon_memory: str = "256m"
    master_host: str = "127.0.0.1"
    master_port: int = 0
    master_webui_port: int = 0
    data_roots: dict[str, Path] = field(default_factory=dict)
    worker_specs: list[WorkerSpec] = field(default_factory=list)
    _master: subprocess.Popen[bytes] | None = None

    @property
    def master_url(self) -> str:
        return f"spark://{self.master_host}:{self.master_port}"

    @property
    def hosts(self) -> list[str]:
        return [w.host for w in self.worker_specs]

    def data_root(self, host: str) -> Path:
        return next(w.data_root for w in self.worker_specs if w.host == host)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, deadline_s: float = 120.0) -> StandaloneCluster:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.master_port = self.master_port or _free_port(self.master_host)
        self.master_webui_port = self.master_webui_port or _free_port(self.master_host)
        try:
            self._start_master()
            _wait_for(self._master_accepts, deadline_s, f"Spark master on {self.master_url}")
            for n in range(self.workers):
                host = f"127.0.0.{self.first_host + n}"
                wdir = self.base_dir / f"worker-{host}"
                spec = WorkerSpec(
                    host=host,
                    data_root=self.data_roots.get(host, wdir / "data"),
                    work_dir=wdir / "work",
                    log=wdir / "worker.log",
                    webui_port=_free_port(host),
                )
                self.worker_specs.append(spec)
                self.start_worker(host)
            _wait_for(lambda: len(self.alive_workers()) == self.workers, deadline_s,
                      f"registration of {self.workers} workers with the master")
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        procs = [w.process for w in self.worker_specs] + [self._master]
        for p in procs:
            _terminate_group(p)
        for w in self.worker_specs:
            w.process = None
        self._master = None

    # -- workers -----------------------------------------------------------------------------
    def start_worker(self, host: str) -> None:
        spec = next(w for w in self.worker_specs if w.host == host)
        if spec.process is not None and spec.process.poll() is None:
            return
        for d in (spec.data_root, spec.work_dir):
            d.mkdir(parents=True, exist_ok=True)
        env = self._env(host)
        env[DATA_ROOT_ENV] = str(spec.data_root)
        env["SPARK_WORKER_DIR"] = str(spec.work_dir)
        cmd = [
            os.path.join(spark_home(), "bin", "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            "--host", host, "--cores", str(self.cores), "--memory", self.memory,
            "--webui-port", str(spec.webui_port), "--work-dir", str(spec.work_dir),
            self.master_url,
        ]
        spec.process = _spawn(cmd, env, spec.log)

    def kill_worker(self, host: str) -> None:
        """SIGKILL a worker daemon and every executor it launched (its process group)."""
        spec = next(w for w in self.worker_specs if w.host == host)
        _kill_group(spec.process, signal.SIGKILL)
        spec.process = None

    def alive_workers(self) -> list[str]:
        """Hosts of the workers the master reports ALIVE."""
        url = f"http://{self.master_host}:{self.master_webui_port}/json/"
        with urllib.request.urlopen(url, timeout=2) as resp:
            state = json.load(resp)
        return sorted(w["host"] for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def wipe_data(self) -> None:
        """Remove every worker's data root contents (between independent tests)."""
        for w in self.worker_specs:
            if w.data_root.exists():
                shutil.rmtree(w.data_root)
            w.data_root.mkdir(parents=True)

    # -- internals ---------------------------------------------------------------------------
    def _env(self, local_ip: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_LOCAL_IP=local_ip,
            SPARK_HOME=spark_home(),
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            PYSPARK_PYTHON=self.python,
            SPARK_LOG_DIR=str(self.base_dir / "logs"),
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def _start_master(self) -> None:
        env = self._env(self.master_host)
        env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
        cmd = [
            os.path.join(spark_home(), "bin", "spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--host", self.master_host, "--port", str(self.master_port),
            "--webui-port", str(self.master_webui_port),
        ]
        self._master = _spawn(cmd, env, self.base_dir / "master.log")

    def _master_accepts(self) -> bool:
        if self._master is not None and self._master.poll() is not None:
            raise TimedOutError(
                f"Spark master exited with {self._master.returncode}; "
                f"see {self.base_dir / 'master.log'}"
            )
        with socket.create_connection((self.master_host, self.master_port), timeout=1):
            return True


def cluster_session(master_url: str, app: str, hosts: int, *, executor_memory: str = "640m",
                    conf: Mapping[str, str] | None = None, deadline_s: float = 240.0) -> Any:
    """A SparkSession on a standalone cluster as this project's tests, benchmarks and tools
    run one: the driver on loopback, no UI or console progress, one core per executor and
    pyspark-kudu's session settings (``SESSION_CONF``), plus ``conf``. Returns once executors
    run on ``hosts`` distinct hosts (pyspark-kudu needs one per tablet server host).

    Raises:
        TimedOutError: fewer hosts had an executor after ``deadline_s`` (the session is
            stopped; the message names the hosts that did).
    """
    from pyspark.sql import SparkSession  # imported here: starting clusters needs no Spark

    from pyspark_kudu.rpc.auth import SECRET_ENV, new_secret
    from pyspark_kudu.spark.host.daemon import SESSION_CONF
    from pyspark_kudu.spark.pinned import executor_hosts

    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this project's Python
    # One credential for every application started from this process and its children
    # (tests' second writers, the fault harness' sessions): they forward writes to each
    # other's session services and read each other's tablet servers.
    secret = os.environ.setdefault(SECRET_ENV, new_secret())
    spark = (SparkSession.builder.master(master_url).appName(app)
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.memory", executor_memory)
             .config("spark.executor.cores", "1")
             .config(map={**dict(SESSION_CONF), f"spark.executorEnv.{SECRET_ENV}": secret,
                          **dict(conf or {})})
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    end = time.monotonic() + deadline_s
    while len(executor_hosts(spark.sparkContext)) < hosts:
        if time.monotonic() > end:
            got = sorted(executor_hosts(spark.sparkContext))
            spark.stop()
            raise TimedOutError(f"executors came up on {got}, want {hosts} hosts, within "
                                f"{deadline_s:.0f} s")
        time.sleep(0.5)  # polling a condition under a deadline
    return spark


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: stop() kills exactly what we started
        )


def _kill_group(p: subprocess.Popen[bytes] | None, sig: signal.Signals) -> None:
    if p is None or p.poll() is not None:
        return
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


def _terminate_group(p: subprocess.Popen[bytes] | None) -> None:
    _kill_group(p, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    """Run a test cluster in the foreground until interrupted (``conf/test-cluster.sh``)."""
    import argparse

    parser = argparse.ArgumentParser(description="Spark standalone test cluster on 127.0.0.x")
    parser.add_argument("--base-dir", default="/tmp/pyspark-kudu-cluster", type=Path)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--memory", default="1g")
    args = parser.parse_args(argv)
    cluster = StandaloneCluster(args.base_dir, workers=args.workers, memory=args.memory)
    cluster.start()
    print(f"master {cluster.master_url} (web UI http://{cluster.master_host}:"
          f"{cluster.master_webui_port}); workers: {', '.join(cluster.hosts)}", flush=True)
    for w in cluster.worker_specs:
        print(f"  {w.host}: data root {w.data_root}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
