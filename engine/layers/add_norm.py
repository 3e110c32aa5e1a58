"""AddLayerNorm: LayerNorm(x + residual) as one Triton kernel on CUDA (one read of each input, one
write), the two torch ops elsewhere; a LayerNorm subclass, so checkpoints map onto it unchanged. Where
its output also feeds an FP8 projection (`quantize`), the same pass writes that input too: the rows in
FP8 with a scale each (engine/layers/fp8.py). A pre-norm block, whose residual stream is the sum, has the
same pass write the sum too (`with_total`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.fp8 import FP8, NEVER, Fp8Rows, quantize_rows
from engine.layers.triton_kernel import triton_kernel

MAX_HIDDEN = 8192  # one row per program: wider rows take the torch ops


class AddLayerNorm(nn.LayerNorm):
    # the rows from which the next projection runs in FP8: the norm writes its input
    # (Backbone.fuse_fp8_inputs)
    quantize_from: float = NEVER

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        # [num_tokens, hidden] x2 -> [num_tokens, hidden]
        return self.with_input(x, residual)[0]

    def with_total(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(LayerNorm(x + residual), x + residual) for a pre-norm block: the sum, rounded to x's dtype as the
        unfused ops round it, is the residual stream. Without a residual (the first block): (LayerNorm(x),
        x)."""
        kernel = _triton_kernel() if x.is_cuda else None
        if residual is None or kernel is None or x.shape[-1] > MAX_HIDDEN:
            total = x if residual is None else x + residual
            return F.layer_norm(total, self.normalized_shape, self.weight, self.bias, self.eps), total
        out, _, total = add_layer_norm(kernel, x, residual, self.weight, self.bias, self.eps, total=True)
        return out, total

    def with_input(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows]:
        """(LayerNorm(x + residual), the next projection's input: the same rows, or from quantize_from rows
        those rows in FP8, written by the same kernel on CUDA)."""
        kernel = _triton_kernel() if x.is_cuda else None
        quantize = x.shape[0] >= self.quantize_from
        if kernel is None or x.shape[-1] > MAX_HIDDEN:
            out = F.layer_norm(x + residual, self.normalized_shape, self.weight, self.bias, self.eps)
            return out, quantize_rows(out) if quantize else out
        return add_layer_norm(kernel, x, residual, self.weight, self.bias, self.eps, quantize)[:2]


def add_layer_norm(
    kernel,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    quantize: bool = False,
    total: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows, torch.Tensor | None]:
    """(LayerNorm(x + residual), the same rows or with `quantize` their Fp8Rows, with `total` the sum
    x + residual in x's dtype, which the norm then reads: else None) by the Triton kernel, on the device
    the tensors are on (Triton's interpreter runs it on the CPU in the tests)."""
    x, residual = x.contiguous(), residual.contiguous()
    out = torch.empty_like(x)
    sums = torch.empty_like(x) if total else out
    num_tokens, hidden = x.shape
    values = torch.empty(num_tokens, hidden, dtype=FP8, device=x.device) if quantize else out
    scales = torch.empty(num_tokens, 1, dtype=torch.float32, device=x.device) if quantize else out
    block = triton_block(hidden)
    kernel[(num_tokens,)](
        x,
        residual,
        weight,
        bias,
        out,
        values,
        scales,
        sums,
        hidden,
        eps,
        QUANTIZE=quantize,
        TOTAL=total,
        BLOCK=block,
        num_warps=4,
    )
    return out, Fp8Rows(values, scales, x.dtype) if quantize else out, sums if total else None


def triton_block(hidden: int) -> int:
    return 1 << (hidden - 1).bit_length()


@triton_kernel
def _triton_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""
    global quantized_row  # jitted code calls module globals, not closures (the interpreter too)
    from engine.layers.fp8_row import quantized_row

    @triton.jit
    def add_layer_norm(x_ptr, residual_ptr, weight_ptr, bias_ptr, out_ptr, values_ptr, scales_ptr,
                       total_ptr, hidden, eps, QUANTIZE: tl.constexpr, TOTAL: tl.constexpr,
                       BLOCK: tl.constexpr):  # fmt: skip
        token = tl.program_id(0).to(tl.int64)
        row = token * hidden
        columns = tl.arange(0, BLOCK)
        mask = columns < hidden
        total = tl.load(x_ptr + row + columns, mask=mask, other=0.0).to(tl.float32)
        total += tl.load(residual_ptr + row + columns, mask=mask, other=0.0).to(tl.float32)
        if TOTAL:  # the residual stream, rounded as the unfused sum is before the norm reads it
            rounded = total.to(total_ptr.dtype.element_ty)
            tl.store(total_ptr + row + columns, rounded, mask=mask)
            total = rounded.to(tl.float32)
        mean = tl.sum(total, axis=0) / hidden
        centered = tl.where(mask, total - mean, 0.0)
        inverse_std = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / hidden + eps)
        weight = tl.load(weight_ptr + columns, mask=mask).to(tl.float32)
        bias = tl.load(bias_ptr + columns, mask=mask).to(tl.float32)
        normed = (centered * inverse_std * weight + bias).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row + columns, normed, mask=mask)
        if QUANTIZE:  # the rounded rows, as quantize_rows reads them
            quantized_row(normed.to(tl.float32), mask, values_ptr + row + columns, scales_ptr + token)

    return add_layer_norm
