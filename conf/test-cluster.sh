#!/usr/bin/env bash
# Run the standalone test cluster (master on 127.0.0.1, 6 workers on 127.0.0.2-7, each with its
# own data root) in the foreground; Ctrl-C stops exactly the processes it started.
#   conf/test-cluster.sh [--base-dir DIR] [--workers N] [--memory 1g]
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pyspark_kudu.testing.standalone_cluster "$@"
