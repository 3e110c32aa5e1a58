"""LazyTensor: a step's result on its way to the host, resolved when its CUDA event fires."""

from __future__ import annotations

import numpy as np
import torch


class LazyTensor:
    """Starts an async device-to-host copy into pinned memory and records an event; `result()`
    waits for that event only. On CPU the copy is the tensor itself and `ready()` is at once True."""

    def __init__(self, device_tensor: torch.Tensor):
        if device_tensor.device.type == "cuda":
            self._host = torch.empty(
                device_tensor.shape, dtype=device_tensor.dtype, device="cpu", pin_memory=True
            )
            self._host.copy_(device_tensor, non_blocking=True)
            self._event: torch.cuda.Event | None = torch.cuda.Event()
            self._event.record()
        else:
            self._host = device_tensor
            self._event = None

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def result(self) -> np.ndarray:
        """Block until the copy is done; the rows as float32 numpy."""
        if self._event is not None:
            self._event.synchronize()
        return self._host.float().numpy()
