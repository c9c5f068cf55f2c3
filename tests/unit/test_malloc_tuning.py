"""glibc's mmap threshold as the resident tablet server fixes it (``tablet.memory``): large
blocks that a thread allocates and frees over and over are reused from its arena, not
mapped, faulted in, zeroed and unmapped each time (what the 1 MiB threshold did, the kernel
then taking ~40% of the servers' CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent("""
    import json, resource, sys, threading
    import numpy as np
    from pyspark_kudu.tablet.memory import return_large_frees_to_os

    arg = sys.argv[1]
    fixed = return_large_frees_to_os() if arg == "default" else return_large_frees_to_os(int(arg))
    out = {"fixed": fixed}

    def work():  # on a thread of its own, as a server's requests are (its own arena)
        keep = []
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        touched = 0
        for _ in range(40):
            x = np.arange(300_000, dtype=np.int64)  # 2.4 MB blocks, as a batch's keys
            y = x * 3
            z = np.argsort(y)
            touched += x.nbytes + y.nbytes + z.nbytes
            keep.append(np.ones(64))  # something small stays, as in real work
            del x, y, z
        out["faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        out["pages"] = touched // 4096

    t = threading.Thread(target=work)
    t.start()
    t.join()
    print(json.dumps(out))
""")


def _faults(arg: str) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", _CHILD, arg], capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_large_blocks_are_reused_not_faulted_in_again() -> None:
    tuned = _faults("default")
    if not tuned["fixed"]:
        pytest.skip("not glibc, or MALLOC_MMAP_THRESHOLD_ is set: glibc's threshold is not ours")
    # The same loop with a 1 MiB threshold (what the server used before) faults in nearly
    # every page it touches: this is what the test tells apart.
    small = _faults(str(1 << 20))
    assert small["faults"] > small["pages"] // 2, small
    assert tuned["faults"] < tuned["pages"] // 10, (
        f"{tuned['faults']} page faults for {tuned['pages']} pages of 2.4 MB blocks allocated"
        f" and freed 120 times: they are mapped anew each time (1 MiB threshold: {small})")
