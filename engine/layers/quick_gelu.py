"""QuickGELU, x * sigmoid(1.702 x) (CLIP's and Qwen2-VL's vision towers): cuBLASLt has no epilogue for it,
and torch's three ops read and write the MLP's widest rows three times; one Triton kernel on CUDA does it in
one pass, in float32 (the torch ops elsewhere)."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.triton_kernel import triton_kernel

BLOCK = 2048


def quick_gelu(x: torch.Tensor, kernel=None) -> torch.Tensor:
    """x * sigmoid(1.702 x), of any shape. `kernel`: the one to launch on x's device (the tests pass Triton's
    CPU interpreter); by default the compiled kernel on CUDA, the torch ops elsewhere."""
    if kernel is None and x.is_cuda:
        kernel = _triton_kernel()
    if kernel is None or not x.is_contiguous():
        return x * torch.sigmoid(1.702 * x)
    out, count = torch.empty_like(x), x.numel()
    kernel[(-(-count // BLOCK),)](x, out, count, BLOCK=BLOCK, num_warps=8)
    return out


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quick_gelu(x)


@triton_kernel
def _triton_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""

    @triton.jit
    def quick_gelu(x_ptr, out_ptr, count, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < count
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offsets, (x * tl.sigmoid(1.702 * x)).to(out_ptr.dtype.element_ty), mask=mask)

    return quick_gelu
