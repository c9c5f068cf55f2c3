"""A one-process pyspark-kudu master for fault runs, with a short tablet-server timeout.

``pyspark-kudu master run`` has no option for how long a tablet server may stay silent
before the master counts it dead (``MasterServerConfig.tserver_unresponsive_s``, 30 s).
A fault run of a few minutes needs the master to notice a dead host in seconds -- and to
declare it failed (``follower_unavailable_considered_failed_sec``) just as fast, so that the
client's healer replaces its replicas -- so the harness starts this module instead (same
server, same catalog format)::

    python -m pyspark_kudu.tools.faults.master --data-dir DIR --address 127.0.0.1:PORT \\
        --tserver-unresponsive-s 6 [--failed-after-s 300]

``--failed-after-s`` (default: the unresponsive time) lets a run keep the product's
300 s instead (chaos mode: its kills are transient, nothing should be re-replicated).

:class:`MasterProcess` starts it in its own process group and only ever signals that.

Thread-safety: :class:`MasterProcess` is not thread-safe (one owner).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.localcluster import free_ports

__all__ = ["MasterProcess", "main"]


class MasterProcess:
    """One master (id ``m1``) serving ``address`` from ``data_dir``."""

    def __init__(self, data_dir: Path, unresponsive_s: float,
                 failed_after_s: float | None = None) -> None:
        self.data_dir = data_dir
        self.unresponsive_s = unresponsive_s
        self.failed_after_s = failed_after_s
        self.address = f"127.0.0.1:{free_ports(1)[0]}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, deadline_s: float = 60.0) -> MasterProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "master.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pyspark_kudu.tools.faults.master",
                 "--data-dir", str(self.data_dir), "--address", self.address,
                 "--tserver-unresponsive-s", str(self.unresponsive_s),
                 *(() if self.failed_after_s is None
                   else ("--failed-after-s", str(self.failed_after_s)))],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        with MasterClient(self.address, timeout_s=deadline_s) as c:
            c.leader_address(timeout_s=deadline_s)
        return self

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    from pyspark_kudu.master.server import MasterServer, MasterServerConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--address", required=True, help="host:port to serve on")
    parser.add_argument("--tserver-unresponsive-s", type=float, default=6.0)
    parser.add_argument("--failed-after-s", type=float, default=None,
                        help="follower_unavailable_considered_failed_sec (default: the "
                             "unresponsive time)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = MasterServer(MasterServerConfig(
        id="m1", peers={"m1": args.address}, data_dir=args.data_dir, sync="fdatasync",
        tserver_unresponsive_s=float(args.tserver_unresponsive_s),
        # A fault run replaces the replicas of a server silent this long (300 s by default).
        follower_unavailable_considered_failed_s=float(
            args.tserver_unresponsive_s if args.failed_after_s is None
            else args.failed_after_s))).start()

    def _stop(signum: int, frame: FrameType | None) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not server.wait(0.5):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
