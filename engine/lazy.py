"""LazyTensor: a step's result on its way to the host, resolved when its CUDA event fires; HostBuffers:
the pinned host memory those copies land in, reused once a result has been read."""

from __future__ import annotations

import numpy as np
import torch

from engine.host_copy import copied

KEPT_BUFFERS = 4  # the engine reads a step's rows before its next-but-one step: two are in use at most
# rows past this many floats are checked for NaN and inf on the device, whose reduction comes back with them:
# on the host the check took longer than their copy (27M floats, a bge-m3 batch's token rows)
DEVICE_CHECK_FLOATS = 1 << 20


class HostBuffers:
    """Pinned float32 host buffers for step results. A fresh pinned allocation per step, with a side
    stream's bookkeeping, cost the H200's host 140 to 280 us a step (batch 1 takes 600)."""

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []

    def take(self, numel: int) -> torch.Tensor:
        for index, buffer in enumerate(self._free):
            if buffer.numel() >= numel:
                return self._free.pop(index)
        return torch.empty(numel, dtype=torch.float32, pin_memory=True)

    def give_back(self, buffer: torch.Tensor) -> None:
        if len(self._free) < KEPT_BUFFERS:
            self._free.append(buffer)


class LazyTensor:
    """On CUDA: copies the float32 rows into pinned host memory on the current stream (after the
    kernels that wrote them, before any later step's) and records `copied`; nothing here blocks the
    host. `result()` waits for that event only and returns a copy, so the buffer serves again. On CPU
    the rows are the tensor itself and `ready()` is at once True."""

    def __init__(self, device_tensor: torch.Tensor, buffers: HostBuffers | None = None):
        self.copied: torch.cuda.Event | None = None
        self._buffers = buffers
        self._buffer: torch.Tensor | None = None
        self._result: np.ndarray | None = None
        self._finite: bool | None = None
        self._device_checked = False  # the buffer's last float says whether every row is finite
        if device_tensor.device.type != "cuda":
            self._host = device_tensor
            return
        if device_tensor.dtype != torch.float32:
            raise TypeError(f"LazyTensor copies float32 rows, not {device_tensor.dtype}")
        numel = device_tensor.numel()
        self._device_checked = numel > DEVICE_CHECK_FLOATS
        size = numel + 1 if self._device_checked else numel
        self._buffer = buffers.take(size) if buffers is not None else torch.empty(size, pin_memory=True)
        self._host = self._buffer[:numel].view(device_tensor.shape)
        self._host.copy_(device_tensor, non_blocking=True)
        if self._device_checked:
            self._buffer[numel : numel + 1].copy_(
                torch.isfinite(device_tensor).all().float(), non_blocking=True
            )
        self.copied = torch.cuda.Event()
        self.copied.record()

    def ready(self) -> bool:
        return self.copied is None or self.copied.query()

    def result(self) -> np.ndarray:
        """Block until the copy is done; the rows as float32 numpy."""
        if self._result is None:
            if self.copied is None:
                self._result = self._host.float().numpy()
            else:
                self.copied.synchronize()
                self._result = copied(self._host.numpy())
                if self._device_checked:
                    self._finite = bool(self._buffer[self._host.numel()] == 1)
                if self._buffers is not None:
                    self._buffers.give_back(self._buffer)
                self._buffer = None
        return self._result

    def all_finite(self) -> bool:
        """Whether every row is free of NaN and inf (after result(): checked on the device for large rows)."""
        if self._finite is None:
            self._finite = bool(np.isfinite(self.result()).all())
        return self._finite
