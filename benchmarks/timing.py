"""timed(): wall-clock samples of a function, the device synchronized before and after each call."""

from __future__ import annotations

import time
from collections.abc import Callable


def timed(function: Callable[[], object], count: int, device: str) -> list[float]:
    """`count` samples in seconds; on CUDA the GPU's queued work is finished before and after each."""
    import torch

    synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    samples = []
    for _ in range(count):
        synchronize()
        start = time.perf_counter()
        function()
        synchronize()
        samples.append(time.perf_counter() - start)
    return samples
