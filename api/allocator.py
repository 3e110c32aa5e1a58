"""keep_freed_memory: glibc's malloc told to keep what a process frees, for a gateway that decodes images.
Each image makes and frees buffers of about 0.5 to 4 MB (its base64 text's bytes, the PNG's, Pillow's
image, the resized one, the patches). glibc hands such memory back to the kernel as it is freed (mmap
above a moving threshold, the heaps' tops trimmed), and the next image faults it in again page by page,
partly inside copies that hold the GIL: on 4 image threads of a 2-core machine 150 to 175 page faults an
image, 9 to 17 with the thresholds raised. On a GPU host's 16 cores, 50 images on 16 threads took 41.6
ms instead of 48.9 with them (the images suite's probe, 2026-12-06, with the mmap threshold at 64 MiB).
Since base64 is pybase64's and an RGB image is not copied (a1ba321, 0e9f14c), an image makes fewer such
buffers: 10 to 40 faults an image without the thresholds, 10 to 30 with them; a buffer above glibc's
moving threshold (a large photo's pixels) is still faulted in anew each time without them. The price is
memory held after a burst: up to the trim threshold above each heap's live data (each decoding thread's
arena), in practice the images' peak working set (a served 50-image rerank's gateway stayed at 494 MB)."""

from __future__ import annotations

import ctypes

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# allocations below this come from the heaps, not mmap (a 40-MP image's do not); glibc's own ceiling for
# its moving threshold, which some versions refuse to exceed
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20  # free memory at a heap's top kept up to this


def keep_freed_memory() -> bool:
    """Raise this process's malloc thresholds (MMAP_THRESHOLD, TRIM_THRESHOLD); False where the C library
    has no mallopt (not glibc) or refuses them."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    kept = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and kept)
