"""Gated MLP activations over the fused gate/up GEMM output: SwiGLU's SiLU(gate) * up and GeGLU's
GELU-tanh(gate) * up (Gemma3); one Triton kernel on CUDA (one read, one write of half the size) instead
of three, the torch ops elsewhere. Where the product feeds an FP8 projection (`quantize`), the kernel
writes it in FP8 with a scale a row instead (a row in one program; engine/layers/fp8.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.errors import UnsupportedModel
from engine.layers.fp8 import FP8, MAX_FUSED_COLUMNS, Fp8Rows, quantize_rows, row_warps
from engine.layers.triton_kernel import triton_kernel

BLOCK_COLUMNS = 1024
GATE_ACTIVATIONS = ("silu", "gelu_tanh")


def silu_and_mul(gate_up: torch.Tensor, kernel=None) -> torch.Tensor:
    """[num_tokens, 2 * intermediate] (gate | up) -> [num_tokens, intermediate]. `kernel`: the one to
    launch on the tensors' device (the tests pass Triton's CPU interpreter); by default the compiled
    kernel on CUDA, the torch ops elsewhere."""
    return gated(gate_up, "silu", kernel)


def gated(
    gate_up: torch.Tensor, activation: str, kernel=None, quantize: bool = False
) -> torch.Tensor | Fp8Rows:
    """[num_tokens, 2 * intermediate] (gate | up) -> activation(gate) * up, [num_tokens, intermediate]
    (with `quantize`, its Fp8Rows); `activation` is one of GATE_ACTIVATIONS, `kernel` as for silu_and_mul."""
    if activation not in GATE_ACTIVATIONS:
        raise UnsupportedModel(f"unsupported gate activation {activation!r}; known: {GATE_ACTIVATIONS}")
    if kernel is None and gate_up.is_cuda:
        kernel = _triton_kernel()
    num_tokens, width = gate_up.shape
    intermediate = width // 2
    if kernel is None or not gate_up.is_contiguous() or (quantize and intermediate > MAX_FUSED_COLUMNS):
        gate, up = gate_up.chunk(2, dim=-1)
        if activation == "silu":
            out = F.silu(gate) * up
        else:
            out = F.gelu(gate, approximate="tanh") * up
        return quantize_rows(out) if quantize else out
    gelu = activation == "gelu_tanh"
    if quantize:  # a row in one program, for its scale
        values = gate_up.new_empty(num_tokens, intermediate, dtype=FP8)
        scales = gate_up.new_empty(num_tokens, 1, dtype=torch.float32)
        block = 1 << (intermediate - 1).bit_length()
        kernel[(num_tokens, 1)](
            gate_up, values, scales, intermediate, GELU_TANH=gelu, QUANTIZE=True, BLOCK=block,
            num_warps=row_warps(block),
        )  # fmt: skip
        return Fp8Rows(values, scales, gate_up.dtype)
    out = gate_up.new_empty(num_tokens, intermediate)
    grid = (num_tokens, -(-intermediate // BLOCK_COLUMNS))
    kernel[grid](
        gate_up, out, out, intermediate, GELU_TANH=gelu, QUANTIZE=False, BLOCK=BLOCK_COLUMNS, num_warps=4
    )
    return out


@triton_kernel
def _triton_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""
    global quantized_row  # jitted code calls module globals, not closures (the interpreter too)
    from engine.layers.fp8_row import quantized_row

    @triton.jit
    def gated_activation(gate_up_ptr, out_ptr, scales_ptr, intermediate, GELU_TANH: tl.constexpr,
                         QUANTIZE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        # the activation rounded to the input dtype before the product, as the unfused ops round it
        token = tl.program_id(0).to(tl.int64)
        columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = columns < intermediate
        row = gate_up_ptr + token * 2 * intermediate
        gate = tl.load(row + columns, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(row + intermediate + columns, mask=mask, other=0.0).to(tl.float32)
        dtype = gate_up_ptr.dtype.element_ty
        if GELU_TANH:
            # 0.5 x (1 + tanh(y)) is x * sigmoid(2 y), y = sqrt(2 / pi) (x + 0.044715 x^3); a literal,
            # since a jitted function reads no plain module globals
            inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
            activated = gate / (1.0 + tl.exp(-2.0 * inner))
        else:
            activated = gate / (1.0 + tl.exp(-gate))
        activated = activated.to(dtype).to(tl.float32)
        product = (activated * up).to(dtype)
        if QUANTIZE:  # the whole row is this program's (BLOCK covers it): the rounded product's scale
            quantized_row(
                product.to(tl.float32), mask, out_ptr + token * intermediate + columns, scales_ptr + token
            )
        else:
            tl.store(out_ptr + token * intermediate + columns, product, mask=mask)

    return gated_activation
