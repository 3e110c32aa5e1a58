"""AddLayerNorm: LayerNorm(x + residual) as one Triton kernel on CUDA (one read of each input, one
write), the two torch ops elsewhere; a LayerNorm subclass, so checkpoints map onto it unchanged."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.triton_kernel import triton_kernel

MAX_HIDDEN = 8192  # one row per program: wider rows take the torch ops


class AddLayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        # [num_tokens, hidden] x2 -> [num_tokens, hidden]
        kernel = _triton_kernel() if x.is_cuda else None
        if kernel is None or x.shape[-1] > MAX_HIDDEN:
            return F.layer_norm(x + residual, self.normalized_shape, self.weight, self.bias, self.eps)
        return add_layer_norm(kernel, x, residual, self.weight, self.bias, self.eps)


def add_layer_norm(
    kernel, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm(x + residual) by the Triton kernel, on the device the tensors are on (Triton's
    interpreter runs it on the CPU in the tests)."""
    x, residual = x.contiguous(), residual.contiguous()
    out = torch.empty_like(x)
    hidden = x.shape[-1]
    block = triton_block(hidden)
    kernel[(x.shape[0],)](x, residual, weight, bias, out, hidden, eps, BLOCK=block, num_warps=4)
    return out


def triton_block(hidden: int) -> int:
    return 1 << (hidden - 1).bit_length()


@triton_kernel
def _triton_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""

    @triton.jit
    def add_layer_norm(x_ptr, residual_ptr, weight_ptr, bias_ptr, out_ptr, hidden, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * hidden
        columns = tl.arange(0, BLOCK)
        mask = columns < hidden
        total = tl.load(x_ptr + row + columns, mask=mask, other=0.0).to(tl.float32)
        total += tl.load(residual_ptr + row + columns, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(total, axis=0) / hidden
        centered = tl.where(mask, total - mean, 0.0)
        inverse_std = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / hidden + eps)
        weight = tl.load(weight_ptr + columns, mask=mask).to(tl.float32)
        bias = tl.load(bias_ptr + columns, mask=mask).to(tl.float32)
        normed = centered * inverse_std * weight + bias
        tl.store(out_ptr + row + columns, normed.to(out_ptr.dtype.element_ty), mask=mask)

    return add_layer_norm
