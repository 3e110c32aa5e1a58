"""QKNormRotary: Qwen3's per-head RMSNorm of queries and keys (Gemma3's with `norm_offset`, scaled by
1 + weight), then rotary, on the fused QKV output (or rotary alone, `qk_norm=False`: Qwen2, Llama,
Mistral, and the vision towers of Qwen2-VL and Qwen3-VL, whose float32 tables rotate in float32, rounded
once). On CUDA one Triton kernel does both for every (token, head) in place (one read, one write)
instead of about a dozen elementwise kernels; elsewhere the torch ops run. A program takes one token and
all of its query and key heads, so the token's angles are read once and a program moves a few KB: one
program per (token, head), moving 256 bytes each, ran at about a sixth of the H200's memory bandwidth."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.rms_norm import RMSNorm
from engine.layers.rotary import apply_rotary
from engine.layers.triton_kernel import triton_kernel


class QKNormRotary(nn.Module):
    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        qk_norm: bool = True,
        norm_offset: bool = False,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.eps = eps
        self.norm_offset = norm_offset
        self.q_norm = RMSNorm(head_dim, eps, norm_offset) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps, norm_offset) if qk_norm else None

    def forward(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # [num_tokens, (heads + 2 kv_heads) * head_dim] -> q [num_tokens, heads, head_dim], k and v
        # [num_tokens, kv_heads, head_dim]; cos/sin [num_tokens, head_dim] in the model dtype, or in
        # float32 for a rotation in float32 (the kernel computes in float32 either way)
        kernel = _triton_kernel() if qkv.is_cuda else None
        if kernel is not None and qkv.is_contiguous():
            qk_norm_rotary(kernel, qkv, cos, sin, self)
            return self.split(qkv)
        q, k, v = self.split(qkv)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return rotated(q, cos, sin), rotated(k, cos, sin), v

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        num_tokens = qkv.shape[0]
        heads = qkv.view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        return heads.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x` rotated in the tables' dtype, in its own."""
    return apply_rotary(x.to(cos.dtype), cos, sin).to(x.dtype)


def qk_norm_rotary(
    kernel, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: QKNormRotary
) -> None:
    """Normalize (where the layer has norms) and rotate the query and key heads of `qkv` in place by the
    Triton kernel, on the device the tensors are on (Triton's interpreter runs it on the CPU in the tests)."""
    half = layer.head_dim // 2
    num_rotated = layer.num_heads + layer.num_kv_heads
    norms = layer.q_norm is not None and layer.k_norm is not None
    block_heads = 1 << (num_rotated - 1).bit_length()
    block = 1 << (half - 1).bit_length()
    kernel[(qkv.shape[0],)](
        qkv,
        cos.contiguous(),
        sin.contiguous(),
        layer.q_norm.weight if norms else qkv,
        layer.k_norm.weight if norms else qkv,
        qkv.shape[1],
        layer.num_heads,
        num_rotated,
        layer.head_dim,
        layer.eps,
        NORM=norms,
        OFFSET=layer.norm_offset,
        HALF=half,
        BLOCK_HEADS=block_heads,
        BLOCK=block,
        num_warps=max(1, min(8, block_heads * block // 512)),
    )


@triton_kernel
def _triton_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""

    @triton.jit
    def qk_norm_rotary(qkv_ptr, cos_ptr, sin_ptr, q_weight_ptr, k_weight_ptr, row_size, num_heads,
                       num_rotated, head_dim, eps, NORM: tl.constexpr, OFFSET: tl.constexpr,
                       HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        # one program per token, a row per query or key head: RMSNorm over each head, rounded and
        # scaled as the unfused ops do, then the rotation of its two halves by the token's angles
        token = tl.program_id(0).to(tl.int64)
        heads = tl.arange(0, BLOCK_HEADS)
        columns = tl.arange(0, BLOCK)
        column_mask = columns < HALF
        mask = (heads < num_rotated)[:, None] & column_mask[None, :]
        first_ptr = qkv_ptr + token * row_size + heads[:, None] * head_dim + columns[None, :]
        first = tl.load(first_ptr, mask=mask, other=0.0).to(tl.float32)
        second = tl.load(first_ptr + HALF, mask=mask, other=0.0).to(tl.float32)
        dtype = qkv_ptr.dtype.element_ty
        if NORM:
            square_sum = tl.sum(first * first, axis=1) + tl.sum(second * second, axis=1)
            inverse_rms = (1.0 / tl.sqrt(square_sum / head_dim + eps))[:, None]
            query = (heads < num_heads)[:, None]
            first_weight = tl.where(
                query,
                tl.load(q_weight_ptr + columns, mask=column_mask).to(tl.float32)[None, :],
                tl.load(k_weight_ptr + columns, mask=column_mask).to(tl.float32)[None, :],
            )
            second_weight = tl.where(
                query,
                tl.load(q_weight_ptr + HALF + columns, mask=column_mask).to(tl.float32)[None, :],
                tl.load(k_weight_ptr + HALF + columns, mask=column_mask).to(tl.float32)[None, :],
            )
            if OFFSET:  # Gemma: scaled by 1 + weight in float32, rounded once
                first = (first * inverse_rms * (1.0 + first_weight)).to(dtype).to(tl.float32)
                second = (second * inverse_rms * (1.0 + second_weight)).to(dtype).to(tl.float32)
            else:  # rounded before the weight scales it, and after
                first = (first * inverse_rms).to(dtype).to(tl.float32) * first_weight
                second = (second * inverse_rms).to(dtype).to(tl.float32) * second_weight
                first, second = first.to(dtype).to(tl.float32), second.to(dtype).to(tl.float32)
        cos = tl.load(cos_ptr + token * head_dim + columns, mask=column_mask).to(tl.float32)[None, :]
        sin = tl.load(sin_ptr + token * head_dim + columns, mask=column_mask).to(tl.float32)[None, :]
        tl.store(first_ptr, (first * cos - second * sin).to(dtype), mask=mask)
        tl.store(first_ptr + HALF, (second * cos + first * sin).to(dtype), mask=mask)

    return qk_norm_rotary
