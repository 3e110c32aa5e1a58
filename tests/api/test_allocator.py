"""keep_freed_memory: a process that frees a buffer and makes it again reuses its memory instead of faulting
it in anew, page by page (each run in a fresh interpreter: the setting is the process's)."""

import subprocess
import sys

import pytest

# a 40 MB buffer (past glibc's largest own mmap threshold, 32 MB) made, written and freed five times: the
# minor page faults of the last four
PROGRAM = """
import resource, sys
from api.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
buffer = b"x" * (40 << 20)
del buffer
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    buffer = b"x" * (40 << 20)
    del buffer
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_buffers_are_reused_not_faulted_in_again():
    pages = (40 << 20) // 4096
    assert faults("default") > 3 * pages  # each buffer faulted in anew
    assert faults("keep") < pages // 10
