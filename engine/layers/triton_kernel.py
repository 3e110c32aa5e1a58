"""triton_kernel: how posy's Triton kernels are defined, compiled on first use and skipped where Triton
is missing (the callers then run their torch ops)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def triton_kernel(build: Callable[[Any, Any], Any]) -> Callable[[], Any]:
    """`build(triton, triton.language) -> kernel` becomes a cached function giving the kernel, or None
    where Triton cannot be imported. Nothing is imported before the first call."""

    @functools.cache
    def kernel() -> Any:
        try:
            import triton
            import triton.language as tl
        except ImportError:
            return None
        return build(triton, tl)

    return kernel
