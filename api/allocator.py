"""keep_freed_memory: glibc's malloc told to keep what a process frees, for a gateway that decodes images.
Each image makes and frees buffers of about 0.5 to 4 MB (its base64 text's bytes, the PNG's, Pillow's
image, the resized one, the patches). glibc returns such memory to the kernel as it is freed (mmap
above a threshold, trimming the heaps' tops), and the next image faults it back in page by page: about
330 page faults an image on a 2-core machine, 0.7 ms of kernel time on 6.9 ms, much of it inside copies
that hold the GIL, and every thread's faults on one address space. With the thresholds raised it keeps
the memory and reuses it: no fault after the first images, 6.2 ms an image there; on a GPU host's 16
cores, 50 images on 16 threads took 41.6 ms instead of 48.9 (the images suite's probe, 2026-12-06). The
price is memory held after a burst: at most the trim threshold above each heap's live data (each
decoding thread's arena), in practice the images' peak working set."""

from __future__ import annotations

import ctypes

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20  # allocations below this come from the heaps, not mmap (a 40-MP image's do not)
TRIM_THRESHOLD = 256 << 20  # free memory at a heap's top kept up to this


def keep_freed_memory() -> bool:
    """Raise this process's malloc thresholds (MMAP_THRESHOLD, TRIM_THRESHOLD); False where the C library
    has no mallopt (not glibc) or refuses them."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
