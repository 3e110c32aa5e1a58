"""quantized_row: the jitted helper posy's fused Triton kernels end with where they hand an FP8 projection
its input (engine/layers/fp8.py). A module of its own that imports Triton, imported only by the kernel
builders: Triton's interpreter reads triton.language from a jitted function's module."""

import triton
import triton.language as tl


@triton.jit
def quantized_row(row, mask, values_ptrs, scale_ptr):
    """A row (float32; masked columns ignored) quantized as quantize_rows does: its values over its scale,
    the largest magnitude over 448 (float8_e4m3fn's largest), at least 1e-12; values and scale stored."""
    # rounded as torch's ops round: the scale by the reciprocal (torch multiplies by a scalar divisor's), the
    # values by IEEE division (Triton's `/` is approximate: a quotient one ulp off flipped the FP8 values
    # that sit on a rounding boundary, on the H200)
    largest = tl.max(tl.where(mask, tl.abs(row), 0.0), axis=0)
    scale = tl.maximum(largest / 448.0, 1e-12)
    values = tl.minimum(tl.maximum(tl.div_rn(row, tl.zeros_like(row) + scale), -448.0), 448.0)
    tl.store(values_ptrs, values.to(values_ptrs.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
    tl.store(scale_ptr, scale)
