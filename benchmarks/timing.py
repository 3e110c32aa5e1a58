"""timed(): wall-clock samples of a function, the device synchronized before and after each call."""

from __future__ import annotations

import time
from collections.abc import Callable


def timed(function: Callable[[], object], count: int, device: str, idle_s: float = 0.0) -> list[float]:
    """`count` samples in seconds; on CUDA the GPU's queued work is finished before and after each.
    `idle_s`: host and device sleep this long before each call, as a server's do between requests."""
    import torch

    synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    samples = []
    for _ in range(count):
        synchronize()
        if idle_s:
            time.sleep(idle_s)
        start = time.perf_counter()
        function()
        synchronize()
        samples.append(time.perf_counter() - start)
    return samples
