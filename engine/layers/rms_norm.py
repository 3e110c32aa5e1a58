"""RMSNorm as Qwen3 computes it (float32 statistics, scaled in the input dtype) or as Gemma3 does
(`offset`: scaled by 1 + weight in float32, then rounded), alone or fused with the residual add that
precedes it in a pre-norm block: one Triton kernel on CUDA (one read of each input, two writes), the
torch ops elsewhere. Where the normalized rows feed an FP8 projection (`quantize`), the kernel writes them
in FP8 with a scale each instead (engine/layers/fp8.py)."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.add_norm import MAX_HIDDEN, triton_block
from engine.layers.fp8 import FP8, NEVER, Fp8Rows, quantize_rows
from engine.layers.triton_kernel import triton_kernel


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool = False) -> torch.Tensor:
    # [..., hidden] -> [..., hidden]; rounded to the input dtype before the weight scales it, as HF's Qwen3
    # does, or (`offset`) after the float32 scaling by 1 + weight, as HF's Gemma3 does
    variance = x.float().pow(2).mean(-1, keepdim=True)
    normed = x.float() * torch.rsqrt(variance + eps)
    if offset:
        return (normed * (1.0 + weight.float())).to(x.dtype)
    return weight * normed.to(x.dtype)


class RMSNorm(nn.Module):
    """`offset`: the checkpoint's weight is a delta from one (Gemma's norms, initialized at zero); it is
    kept as loaded, so that strict loading maps it and no rounding of 1 + weight is stored."""

    def __init__(self, hidden_size: int, eps: float, offset: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [..., hidden] -> [..., hidden]
        return rms_norm(x, self.weight, self.eps, self.offset)


class AddRMSNorm(RMSNorm):
    """(RMSNorm(x + residual), x + residual): the sum is the next block's residual stream. Without a
    residual (the first block) it is (RMSNorm(x), x). From quantize_from rows on, the normalized rows come as
    Fp8Rows."""

    # the rows from which the next projection runs in FP8: the norm writes its input
    # (Backbone.fuse_fp8_inputs)
    quantize_from: float = NEVER

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor | Fp8Rows, torch.Tensor]:
        # [num_tokens, hidden] x2 -> [num_tokens, hidden] (or its Fp8Rows) and [num_tokens, hidden]
        kernel = _triton_kernel() if x.is_cuda else None
        quantize = x.shape[0] >= self.quantize_from
        if kernel is None or x.shape[-1] > MAX_HIDDEN:
            total = x if residual is None else x + residual
            normed = rms_norm(total, self.weight, self.eps, self.offset)
            return quantize_rows(normed) if quantize else normed, total
        return add_rms_norm(kernel, x, residual, self.weight, self.eps, self.offset, quantize)


def add_rms_norm(
    kernel,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    offset: bool = False,
    quantize: bool = False,
) -> tuple[torch.Tensor | Fp8Rows, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual) by the Triton kernel, on the device the tensors are on
    (Triton's interpreter runs it on the CPU in the tests). The sum is rounded to the input dtype before
    the norm reads it, as the unfused ops do. With `quantize`, the normalized rows as Fp8Rows."""
    x = x.contiguous()
    has_residual = residual is not None
    total = torch.empty_like(x) if has_residual else x
    num_tokens, hidden = x.shape
    out = torch.empty(num_tokens, hidden, dtype=FP8 if quantize else x.dtype, device=x.device)
    scales = torch.empty(num_tokens, 1, dtype=torch.float32, device=x.device) if quantize else out
    kernel[(num_tokens,)](
        x,
        residual.contiguous() if has_residual else x,
        weight,
        out,
        scales,
        total,
        hidden,
        eps,
        HAS_RESIDUAL=has_residual,
        OFFSET=offset,
        QUANTIZE=quantize,
        BLOCK=triton_block(hidden),
        num_warps=4,
    )
    return Fp8Rows(out, scales, x.dtype) if quantize else out, total


@triton_kernel
def _triton_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""
    global quantized_row  # jitted code calls module globals, not closures (the interpreter too)
    from engine.layers.fp8_row import quantized_row

    @triton.jit
    def add_rms_norm(x_ptr, residual_ptr, weight_ptr, out_ptr, scales_ptr, total_ptr, hidden, eps,
                     HAS_RESIDUAL: tl.constexpr, OFFSET: tl.constexpr, QUANTIZE: tl.constexpr,
                     BLOCK: tl.constexpr):  # fmt: skip
        token = tl.program_id(0).to(tl.int64)
        row = token * hidden
        columns = tl.arange(0, BLOCK)
        mask = columns < hidden
        total = tl.load(x_ptr + row + columns, mask=mask, other=0.0)
        dtype = total.dtype  # the model's: the rows are rounded to it, quantized or not
        if HAS_RESIDUAL:
            residual = tl.load(residual_ptr + row + columns, mask=mask, other=0.0)
            total = (total.to(tl.float32) + residual.to(tl.float32)).to(total_ptr.dtype.element_ty)
            tl.store(total_ptr + row + columns, total, mask=mask)
        total = total.to(tl.float32)
        inverse_rms = 1.0 / tl.sqrt(tl.sum(total * total, axis=0) / hidden + eps)
        weight = tl.load(weight_ptr + columns, mask=mask).to(tl.float32)
        if OFFSET:  # Gemma: scaled by 1 + weight in float32, rounded once
            normed = total * inverse_rms * (1.0 + weight)
        else:  # rounded to the input dtype before the weight scales it
            normed = (total * inverse_rms).to(dtype).to(tl.float32) * weight
        if QUANTIZE:  # the rounded rows, as quantize_rows reads them
            quantized_row(normed.to(dtype).to(tl.float32), mask, out_ptr + row + columns, scales_ptr + token)
        else:
            tl.store(out_ptr + row + columns, normed.to(dtype), mask=mask)

    return add_rms_norm
