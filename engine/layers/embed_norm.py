"""embed_layer_norm: BERT's embeddings, LayerNorm(word[id] + position[pos + offset] + type[t]) (no type
term for a model without a type table, DistilBERT), as one
Triton kernel on CUDA (three row gathers, the sum in float32, the norm, one write) instead of six
kernels; None where it does not apply, and the caller runs the torch ops. Token ids are checked against
the vocabulary before they reach the engine (api/tokenize.py), so the gathers stay in bounds."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.add_norm import MAX_HIDDEN, triton_block
from engine.layers.triton_kernel import triton_kernel


def embed_layer_norm(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    word: nn.Embedding,
    position: nn.Embedding,
    token_type: nn.Embedding | None,
    norm: nn.LayerNorm,
    position_offset: int,
    kernel=None,
) -> torch.Tensor | None:
    """[num_tokens] ids, positions and types (None: type 0 for all, where there is a `token_type`
    table) -> [num_tokens, hidden], or None.
    `kernel`: the one to launch on the tensors' device (the tests pass Triton's CPU interpreter);
    by default the compiled kernel on CUDA, None elsewhere."""
    if kernel is None and input_ids.is_cuda:
        kernel = _triton_kernel()
    hidden = word.weight.shape[1]
    if kernel is None or hidden > MAX_HIDDEN or input_ids.shape[0] == 0:
        return None
    out = torch.empty(input_ids.shape[0], hidden, dtype=word.weight.dtype, device=input_ids.device)
    use_types = token_type_ids is not None and token_type is not None
    kernel[(input_ids.shape[0],)](
        input_ids, positions, token_type_ids if use_types else input_ids,
        word.weight, position.weight, word.weight if token_type is None else token_type.weight, norm.weight,
        norm.bias, out, hidden, position_offset, norm.eps,
        USE_TYPES=use_types, HAS_TYPE_TABLE=token_type is not None, BLOCK=triton_block(hidden), num_warps=4,
    )  # fmt: skip
    return out


@triton_kernel
def _triton_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""

    @triton.jit
    def embed_norm(
        ids_ptr, positions_ptr, types_ptr, word_ptr, position_ptr, type_ptr, weight_ptr, bias_ptr, out_ptr,
        hidden, position_offset, eps, USE_TYPES: tl.constexpr, HAS_TYPE_TABLE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        columns = tl.arange(0, BLOCK)
        mask = columns < hidden
        token = tl.load(ids_ptr + row).to(tl.int64)
        position = tl.load(positions_ptr + row).to(tl.int64) + position_offset
        total = tl.load(word_ptr + token * hidden + columns, mask=mask, other=0.0).to(tl.float32)
        total += tl.load(position_ptr + position * hidden + columns, mask=mask, other=0.0).to(tl.float32)
        if HAS_TYPE_TABLE:
            token_type = tl.load(types_ptr + row).to(tl.int64) if USE_TYPES else 0
            total += tl.load(type_ptr + token_type * hidden + columns, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(total, axis=0) / hidden
        centered = tl.where(mask, total - mean, 0.0)
        inverse_std = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / hidden + eps)
        weight = tl.load(weight_ptr + columns, mask=mask).to(tl.float32)
        bias = tl.load(bias_ptr + columns, mask=mask).to(tl.float32)
        normed = centered * inverse_std * weight + bias
        tl.store(out_ptr + row * hidden + columns, normed.to(out_ptr.dtype.element_ty), mask=mask)

    return embed_norm
