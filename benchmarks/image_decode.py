"""`python -m benchmarks.image_decode [ROOT]`: what bounds a gateway's decoding of one request's images on
this host. The images suite's 50 PNGs (320x240 to 640x480) made into SigLIP-224 patches (api/images.py's
image_patches, with a gateway's allocator settings) on 1, 8 and 16 threads and on 16 processes, the p50
of 15 rounds each, and the host's CPU. Threads near the processes' time lose little to the GIL. ROOT: the
tree to import api/ from (the baseline's, `bash benchmarks/make_base.sh REV` puts one in .base), else
this one. CPU only; the records of a run go in benchmarks/profiles/."""

from __future__ import annotations

import base64
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

NUM_IMAGES, ROUNDS = 50, 15
WORKERS = (
    (ThreadPoolExecutor, 1),
    (ThreadPoolExecutor, 8),
    (ThreadPoolExecutor, 16),
    (ProcessPoolExecutor, 16),
)
CPU_FACTS = ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)")


def patches_of(uri: str) -> tuple[int, ...]:
    from api.images import ImageLimits, image_patches
    from engine.checkpoint.images import ImageLayout

    layout = ImageLayout(
        shortest_edge=None, resize_to=(224, 224), resample=3, crop=None, rescale=1 / 255, mean=(0.5,) * 3,
        std=(0.5,) * 3, image_size=224, patch_size=16, leading_tokens=0,
    )  # fmt: skip
    return image_patches(uri, layout, ImageLimits(), "input[0]").shape


def p50_ms(pool: Executor, uris: list[str]) -> float:
    list(pool.map(patches_of, uris))  # warm: the workers, their imports, the allocator
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        list(pool.map(patches_of, uris))
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def tree_commit(root: str) -> str:
    """The commit a tree is of: a baseline's COMMIT file, else its git HEAD."""
    marked = os.path.join(root, "COMMIT")
    if os.path.exists(marked):
        return open(marked).read().strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return head.stdout.strip() or "this tree"


def main(argv: list[str]) -> None:
    root = os.path.abspath(argv[0]) if argv else os.getcwd()
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])  # the processes'
    from api.allocator import keep_freed_memory
    from benchmarks.images import png_images

    keep_freed_memory()  # as a gateway of an image model does
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if os.name == "posix" else ""
    for line in lscpu.splitlines():
        if line.split(":")[0] in CPU_FACTS:
            print(" ".join(line.split()))
    label = tree_commit(root)
    uris = [f"data:image/png;base64,{base64.b64encode(data).decode()}" for data in png_images(NUM_IMAGES, 1)]
    for kind, count in WORKERS:
        with kind(count) as pool:
            name = "threads" if kind is ThreadPoolExecutor else "processes"
            print(
                f"{label}: {NUM_IMAGES} images on {count} {name}: p50 {p50_ms(pool, uris):.1f} ms", flush=True
            )


if __name__ == "__main__":
    main(sys.argv[1:])
