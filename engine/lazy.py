"""LazyTensor: a step's result on its way to the host, resolved when its CUDA event fires."""

from __future__ import annotations

import numpy as np
import torch


class LazyTensor:
    """On CUDA: the copy stream waits for the compute stream, copies the rows into pinned host
    memory and records `copied`; nothing here blocks the host. `result()` waits for that event
    only. On CPU the rows are the tensor itself and `ready()` is at once True."""

    def __init__(self, device_tensor: torch.Tensor, copy_stream: torch.cuda.Stream | None = None):
        self.copied: torch.cuda.Event | None = None
        if device_tensor.device.type != "cuda":
            self._host = device_tensor
            return
        self._host = torch.empty(device_tensor.shape, dtype=device_tensor.dtype, pin_memory=True)
        stream = copy_stream or torch.cuda.current_stream(device_tensor.device)
        stream.wait_stream(torch.cuda.current_stream(device_tensor.device))
        with torch.cuda.stream(stream):
            self._host.copy_(device_tensor, non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record(stream)
        # the caching allocator must not hand the rows out again before the copy has read them
        device_tensor.record_stream(stream)

    def ready(self) -> bool:
        return self.copied is None or self.copied.query()

    def result(self) -> np.ndarray:
        """Block until the copy is done; the rows as float32 numpy."""
        if self.copied is not None:
            self.copied.synchronize()
        return self._host.float().numpy()
