"""glibc's allocator as a tablet server sets it (pyspark_kudu.tablet.memory:
``return_large_frees_to_os``): freed large blocks go back to the OS instead of staying
resident in glibc's heaps, and blocks a thread allocates and frees over and over are reused,
not mapped, faulted in, zeroed and unmapped each time (what the 1 MiB threshold did, the
kernel then taking ~40% of the servers' CPU)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from pyspark_kudu.tablet.memory import MMAP_THRESHOLD_BYTES

# In a fresh process each time: the threshold is process-wide and glibc raises it for good.
PROBE = textwrap.dedent("""
    import ctypes, sys
    from pyspark_kudu.tablet.memory import return_large_frees_to_os

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    set_it = sys.argv[1] == "set"
    if set_it and not return_large_frees_to_os():
        raise SystemExit("return_large_frees_to_os() did not set the threshold")
    # Freeing a mapped 30 MiB block: glibc's default then raises its mmap threshold to
    # 30 MiB and its heap trim threshold to twice that.
    libc.free(libc.malloc(30 << 20))
    mapped_before = libc.mallinfo2().hblkhd  # bytes in blocks with a mapping of their own
    block = libc.malloc(20 << 20)  # more than the heap has free: from its top
    ctypes.memset(block, 1, 20 << 20)
    mapped = libc.mallinfo2().hblkhd - mapped_before >= 20 << 20
    libc.free(block)
    kept = libc.mallinfo2().keepcost  # the free space at the heap's top, not given back
    print("mapped" if mapped else "kept" if kept >= 20 << 20 else "released")
""")


# A thread (its own arena, as a server's requests) allocating and freeing 2.4 MB blocks.
FAULTS = textwrap.dedent("""
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


def _run(code: str, arg: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code, arg], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def _probe(mode: str) -> str:
    return _run(PROBE, mode)


def _faults(arg: str) -> dict[str, int]:
    return json.loads(_run(FAULTS, arg))  # type: ignore[no-any-return]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                    reason="the mmap threshold is glibc's; other C libraries are left alone")
def test_a_large_block_freed_at_the_top_of_the_heap_goes_back_at_once() -> None:
    assert 30 << 20 < MMAP_THRESHOLD_BYTES  # taken from the heap either way
    # glibc's default: after a larger mapped block was freed, its trim threshold is 60 MiB,
    # so a 20 MiB block freed at the top of the heap stays resident.
    assert _probe("default") == "kept"
    # As the tablet server sets it: the trim threshold stays at 128 KiB, so the heap gives
    # the block back when it is freed (blocks from MMAP_THRESHOLD_BYTES up are mappings of
    # their own, as with the default).
    assert _probe("set") == "released"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                    reason="the mmap threshold is glibc's; other C libraries are left alone")
def test_large_blocks_are_reused_not_faulted_in_again() -> None:
    tuned = _faults("default")
    assert tuned["fixed"], "return_large_frees_to_os() did not set the threshold"
    # The same loop with a 1 MiB threshold (what the server used before) faults in nearly
    # every page it touches: this is what the test tells apart.
    small = _faults(str(1 << 20))
    assert small["faults"] > small["pages"] // 2, small
    assert tuned["faults"] < tuned["pages"] // 10, (
        f"{tuned['faults']} page faults for {tuned['pages']} pages of 2.4 MB blocks allocated"
        f" and freed 120 times: they are mapped anew each time (1 MiB threshold: {small})")


def test_an_explicit_malloc_setting_in_the_environment_is_left_to_glibc() -> None:
    code = ("import os; os.environ['MALLOC_MMAP_THRESHOLD_'] = '65536'; "
            "from pyspark_kudu.tablet.memory import return_large_frees_to_os as f; "
            "print(f())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
