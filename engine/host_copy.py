"""Host copies of step rows: large ones on torch's CPU threads, not numpy's one (a bge-m3 batch's token
rows, 16k x 1,025 floats, took longer to copy out of the pinned buffer than to compute). torch is imported
only for those, in the engine's process: the gateway imports engine.request without it."""

from __future__ import annotations

import numpy as np

PARALLEL_COPY_FLOATS = 1 << 20


def copied(rows: np.ndarray) -> np.ndarray:
    """A copy of `rows`."""
    if rows.size <= PARALLEL_COPY_FLOATS:
        return rows.copy()
    target = np.empty_like(rows)
    copy_into(target, rows)
    return target


def copy_into(target: np.ndarray, rows: np.ndarray) -> None:
    """target[...] = rows, of one shape."""
    if rows.size <= PARALLEL_COPY_FLOATS:
        target[...] = rows
        return
    import torch

    torch.from_numpy(target).copy_(torch.from_numpy(rows))
