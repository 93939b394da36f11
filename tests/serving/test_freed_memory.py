"""A serving process gives back the memory of large blocks once they are freed (a client's
huge WebSocket message, a big body), even after the pattern that makes glibc keep it: one
large block freed (which raises glibc's mmap threshold), then many large blocks interleaved
with small ones that live on. bench/websocket_memory.py measures the served app itself."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
from pathlib import Path

def rss_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024

if sys.argv[1] == "serving":
    from synth_deploy.serving import prepare_serving_process
    prepare_serving_process()
idle = rss_mib()
# One large block freed (glibc would raise its threshold past the next ones), then large
# blocks between small ones that live on; every page written, so resident.
big = bytearray(20 << 20); big[::4096] = b"x" * len(big[::4096]); del big
kept, large = [], []
for _ in range(50):
    b = bytearray(4 << 20); b[::4096] = b"x" * len(b[::4096]); large.append(b)
    kept.append(bytearray(2000))
peak = rss_mib()
del large
print(idle, peak, rss_mib())
"""


def after_minus_idle(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    idle, peak, after = map(int, out.split())
    assert peak - idle > 150  # the blocks were resident
    return after - idle


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator rules")
def test_a_serving_process_gives_back_freed_large_blocks():
    assert after_minus_idle("plain") > 100  # the pattern keeps 200 MiB without the setting
    assert after_minus_idle("serving") < 20
