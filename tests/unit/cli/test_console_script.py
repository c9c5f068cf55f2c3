"""The installed ``pyspark-kudu`` console script, run as a separate process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import TOKEN, Masters


def test_the_console_script_lists_tablet_servers_with_locations_as_json(
    healthy: Masters,
) -> None:
    script = Path(sys.executable).with_name("pyspark-kudu")
    assert script.exists(), f"console script missing next to {sys.executable}; pip install -e ."
    env = dict(os.environ, PYSPARK_KUDU_MASTER_TOKEN=TOKEN)
    env.pop("PYSPARK_KUDU_MASTER", None)
    out = subprocess.run(
        [str(script), "tserver", "list", "--master", healthy.address,
         "--columns=uuid,location", "--format=json"],
        capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0] == {"uuid": "ts2", "location": "/dc1/rack1"}
    usage = subprocess.run([str(script), "tserver", "list", "--columns=uuid,nope",
                            "--master", healthy.address], capture_output=True, text=True,
                           env=env, timeout=60, check=False)
    assert usage.returncode == 2
    assert "unknown column (--columns): nope" in usage.stderr
