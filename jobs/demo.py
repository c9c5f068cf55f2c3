"""Demo: a 3-replica Raft group elects a leader, commits writes, survives losing its leader.

Until the Spark runtime lands (issue 6) this demo drives the consensus core in-process over
the deterministic simulator's network; later it grows into the end-to-end table demo.

    python jobs/demo.py [--seed N]
"""

from __future__ import annotations

import argparse

from pyspark_kudu.consensus.demo import run_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7, help="seed of the simulated network")
    args = parser.parse_args()
    run_demo(args.seed, print)


if __name__ == "__main__":
    main()
