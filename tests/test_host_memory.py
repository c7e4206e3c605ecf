"""A finished stage's freed memory goes back to the OS (mem1_core.runs.host_memory)."""

from __future__ import annotations

import sys
import time

import pytest

from mem1_core.runs.host_memory import resident_bytes

FRAGMENT = """
import json
from mem1_core.runs.host_memory import release_freed_memory, resident_bytes
base = resident_bytes()
blocks = [bytearray(b"x" * 4096) for _ in range(75_000)]
keep = blocks[::64]
del blocks
held = resident_bytes() - base
freed = release_freed_memory("test")
print(json.dumps({"held": held, "freed": freed, "after": resident_bytes() - base, "kept": len(keep)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_fragmented_memory_leaves_the_resident_set():
    """300 MB in 4 KB blocks (below glibc's mmap threshold: they live in its heap), one in 64
    kept: freeing the rest leaves the resident set where it was (the survivors pin the heap),
    and releasing returns most of it. In a fresh process: in one that has run other tests the
    blocks can land in freed heap pages that are resident already, and the set does not grow."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-c", FRAGMENT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["held"] > 200 * 2**20  # the freed blocks are still resident
    assert r["freed"] > 200 * 2**20
    assert r["after"] < 100 * 2**20
    assert r["kept"] == 1172


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_another_process_resident_set():
    """A child holding 200 MB reads as at least that; a process that has ended reads None."""
    import subprocess

    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; b = b'x' * (200 * 2**20); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while (resident_bytes(child.pid) or 0) < 200 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert resident_bytes(child.pid) >= 200 * 2**20
    finally:
        child.communicate(b"")
    assert resident_bytes(child.pid) is None
