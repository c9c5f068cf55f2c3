"""Standalone master processes on loopback, for tests and benchmarks.

:class:`MasterProcessCluster` starts ``pyspark-kudu master run`` processes (one per master
id, each with its own data dir under ``root``), kills them with any signal (SIGKILL for
crash tests), restarts them, and always cleans up the processes *it* started -- by pid,
never by name. Waiting is on conditions with deadlines, and a failure says what did not
happen.

Thread-safety: not thread-safe; one test or benchmark drives a cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from types import TracebackType

from pyspark_kudu.errors import KuduError, TimedOutError
from pyspark_kudu.fileio import open_private
from pyspark_kudu.master.client import MasterClient

__all__ = ["MasterProcessCluster", "free_ports"]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that were free a moment ago on ``host``."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class MasterProcessCluster:
    """``n`` master processes ``m1..mn`` on ``127.0.0.1`` (free ports unless ``ports``)."""

    def __init__(
        self,
        root: str,
        n: int = 3,
        *,
        ports: Sequence[int] | None = None,
        token: str | None = None,
        fsync: str = "fdatasync",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.root = root
        ports = list(ports) if ports is not None else free_ports(n)
        self.peers = {f"m{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports[:n])}
        self.token = token
        self.fsync = fsync
        self.extra_args = list(extra_args)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._token_file = os.path.join(root, "token")
        if token:
            os.makedirs(root, exist_ok=True)
            with open_private(self._token_file, "w") as f:
                f.write(token)

    @property
    def master_addresses(self) -> str:
        """The ``kudu.master`` string of the founding group."""
        return ",".join(self.peers.values())

    def peers_spec(self) -> str:
        return ",".join(f"{m}={a}" for m, a in self.peers.items())

    # -- processes -------------------------------------------------------------------------
    def start(self, ids: Sequence[str] | None = None, *, join: bool = False) -> None:
        for m in ids or list(self.peers):
            self._spawn(m, join=join)

    def _spawn(self, node_id: str, *, join: bool = False) -> None:
        if node_id in self.procs and self.procs[node_id].poll() is None:
            raise RuntimeError(f"master {node_id} is already running")
        data = os.path.join(self.root, node_id)
        os.makedirs(data, exist_ok=True)
        args = [sys.executable, "-m", "pyspark_kudu.tools.cli", "master", "run",
                "--id", node_id, "--peers", self.peers_spec(), "--data-dir", data,
                "--fsync", self.fsync, "--log-level", "WARNING", *self.extra_args]
        if join:
            args.append("--join")
        if self.token:
            args += ["--token-file", self._token_file]
        log = open(os.path.join(self.root, f"{node_id}.log"), "ab")
        try:
            self.procs[node_id] = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        finally:
            log.close()

    def add_peer(self, node_id: str, port: int | None = None) -> str:
        """Declare a new master (not started); returns its address."""
        self.peers[node_id] = f"127.0.0.1:{port or free_ports(1)[0]}"
        return self.peers[node_id]

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.get(node_id)
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            p.wait(timeout=30)

    def restart(self, node_id: str) -> None:
        self.kill(node_id, signal.SIGKILL)
        self._spawn(node_id)

    def running(self) -> list[str]:
        return [m for m, p in self.procs.items() if p.poll() is None]

    def stop(self) -> None:
        """SIGTERM every process this cluster started, SIGKILL what does not exit in 10 s."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def __enter__(self) -> MasterProcessCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- observation -----------------------------------------------------------------------
    def client(self, **kwargs: object) -> MasterClient:
        return MasterClient(self.master_addresses, token=self.token, **kwargs)  # type: ignore

    def wait_for_leader(self, timeout_s: float = 30.0, among: Sequence[str] | None = None) -> str:
        """The id of a ready leader among the running masters; TimedOutError if none."""
        want = set(among or self.running())
        end = time.monotonic() + timeout_s
        last: object = None
        with MasterClient([self.peers[m] for m in sorted(want)], token=self.token,
                          check_master_count=False) as c:
            while time.monotonic() < end:
                for m in sorted(want):
                    if self.procs.get(m) is None or self.procs[m].poll() is not None:
                        continue
                    try:
                        st = c._channel(self.peers[m]).call("status", {}, 1.0)
                    except KuduError as e:
                        last = e
                        continue
                    if st["role"] == "leader" and st["leader_ready"]:
                        return str(st["id"])
                    last = st
                time.sleep(0.05)
        raise TimedOutError(f"no ready leader among masters {sorted(want)} within "
                            f"{timeout_s:.0f} s; last status or error: {last}; logs in "
                            f"{self.root}")

    def log_tail(self, node_id: str, lines: int = 30) -> str:
        path = os.path.join(self.root, f"{node_id}.log")
        if not os.path.exists(path):
            return ""
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
