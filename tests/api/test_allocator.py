"""keep_freed_memory: a gateway that decodes image after image reuses the memory it frees instead of
faulting it in anew, page by page (each run in a fresh interpreter: the setting is the process's)."""

import subprocess
import sys

import pytest

# 50 photo-sized PNGs decoded into SigLIP2 NaFlex patches on 4 threads, twice over: the minor page faults
# of the second pass, an image
IMAGES = """
import base64, resource, sys
from concurrent.futures import ThreadPoolExecutor
from api import images
from api.allocator import keep_freed_memory
from benchmarks.images import png_images
from engine.checkpoint.images import ImageLayout

if sys.argv[1] == "keep":
    assert keep_freed_memory()
layout = ImageLayout(None, None, 2, None, 1 / 255, (0.5,) * 3, (0.5,) * 3, None, 16, 0, max_num_patches=256)
uris = ["data:image/png;base64," + base64.b64encode(data).decode() for data in png_images(50, seed=1)]
with ThreadPoolExecutor(4) as pool:  # as a gateway's image threads
    for passes in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        list(pool.map(lambda uri: images.image_patches(uri, layout, images.ImageLimits(), "input"), uris))
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / len(uris))
"""
# a 16 MB buffer (a 4-megapixel image's pixels) made, freed and made again: the minor page faults of the
# second making
BUFFER = """
import resource, sys
from api.allocator import keep_freed_memory

if sys.argv[1] == "keep":
    assert keep_freed_memory()
for makings in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = bytearray(16 << 20)
    buffer[::4096] = b"x" * len(buffer[::4096])
    del buffer
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES = (16 << 20) // 4096


def faults(program: str, mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", program, mode], capture_output=True, text=True, check=True)
    return float(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_buffer_made_again_is_not_faulted_in_anew():
    assert faults(BUFFER, "default") > PAGES / 2  # glibc unmapped it as it was freed: every page faulted
    assert faults(BUFFER, "keep") < PAGES / 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_decoding_image_after_image_reuses_freed_memory():
    # an image's buffers (its base64's bytes, the PNG's pixels, the resized image, the patches) span about
    # 400 pages; 10 to 30 are faulted an image here (150 to 175 were, before pybase64 and without the
    # setting)
    assert faults(IMAGES, "keep") < 100
