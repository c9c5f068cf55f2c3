"""Child process for the crash tests: run the workload up to a phase, crashing inside it.

Usage: ``python crash_child.py ROOT LOG_PATH PHASE CRASH_POINT``. Exits with
``CRASH_EXIT_CODE`` when the crash point is reached, 0 if it never was.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.unit.tablet.filelog import FileLog
from tests.unit.tablet.workload import open_or_create, run_phases


def main() -> None:
    root, log_path, phase, point = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    log = FileLog(log_path)
    tablet = open_or_create(root, log)
    run_phases(tablet, log, range(phase + 1), crash_phase=phase, crash_at=point)


if __name__ == "__main__":
    main()
