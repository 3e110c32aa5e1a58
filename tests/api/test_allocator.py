"""keep_freed_memory: a gateway that decodes image after image reuses the memory it frees instead of
faulting it in anew, page by page (each run in a fresh interpreter: the setting is the process's)."""

import subprocess
import sys

import pytest

# 50 photo-sized PNGs decoded into SigLIP2 NaFlex patches on 4 threads, twice over: the minor page faults
# of the second pass, an image
PROGRAM = """
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


def faults_an_image(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
    return float(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_decoding_image_after_image_reuses_freed_memory():
    default = faults_an_image("default")  # each image's buffers faulted in anew: 150 to 175 pages here
    assert default > 50
    assert faults_an_image("keep") < default / 4  # 9 to 17 here
