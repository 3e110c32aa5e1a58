"""Gated MLP activations over the fused gate/up GEMM output: SwiGLU's SiLU(gate) * up and GeGLU's
GELU-tanh(gate) * up (Gemma3); one Triton kernel on CUDA (one read, one write of half the size) instead
of three, the torch ops elsewhere."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.errors import UnsupportedModel
from engine.layers.triton_kernel import triton_kernel

BLOCK_COLUMNS = 1024
GATE_ACTIVATIONS = ("silu", "gelu_tanh")


def silu_and_mul(gate_up: torch.Tensor, kernel=None) -> torch.Tensor:
    """[num_tokens, 2 * intermediate] (gate | up) -> [num_tokens, intermediate]. `kernel`: the one to
    launch on the tensors' device (the tests pass Triton's CPU interpreter); by default the compiled
    kernel on CUDA, the torch ops elsewhere."""
    return gated(gate_up, "silu", kernel)


def gated(gate_up: torch.Tensor, activation: str, kernel=None) -> torch.Tensor:
    """[num_tokens, 2 * intermediate] (gate | up) -> activation(gate) * up, [num_tokens, intermediate];
    `activation` is one of GATE_ACTIVATIONS, `kernel` as for silu_and_mul."""
    if activation not in GATE_ACTIVATIONS:
        raise UnsupportedModel(f"unsupported gate activation {activation!r}; known: {GATE_ACTIVATIONS}")
    if kernel is None and gate_up.is_cuda:
        kernel = _triton_kernel()
    if kernel is None or not gate_up.is_contiguous():
        gate, up = gate_up.chunk(2, dim=-1)
        if activation == "silu":
            return F.silu(gate) * up
        return F.gelu(gate, approximate="tanh") * up
    num_tokens, width = gate_up.shape
    out = gate_up.new_empty(num_tokens, width // 2)
    grid = (num_tokens, -(-(width // 2) // BLOCK_COLUMNS))
    gelu = activation == "gelu_tanh"
    kernel[grid](gate_up, out, width // 2, GELU_TANH=gelu, BLOCK=BLOCK_COLUMNS, num_warps=4)
    return out


@triton_kernel
def _triton_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""

    @triton.jit
    def gated_activation(gate_up_ptr, out_ptr, intermediate, GELU_TANH: tl.constexpr, BLOCK: tl.constexpr):
        # the activation rounded to the input dtype before the product, as the unfused ops round it
        token = tl.program_id(0).to(tl.int64)
        columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = columns < intermediate
        row = gate_up_ptr + token * 2 * intermediate
        gate = tl.load(row + columns, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(row + intermediate + columns, mask=mask, other=0.0).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        if GELU_TANH:
            # 0.5 x (1 + tanh(y)) is x * sigmoid(2 y), y = sqrt(2 / pi) (x + 0.044715 x^3); a literal,
            # since a jitted function reads no plain module globals
            inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
            activated = gate / (1.0 + tl.exp(-2.0 * inner))
        else:
            activated = gate / (1.0 + tl.exp(-gate))
        activated = activated.to(dtype).to(tl.float32)
        tl.store(out_ptr + token * intermediate + columns, (activated * up).to(dtype), mask=mask)

    return gated_activation
