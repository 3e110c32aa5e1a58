"""The triton backend: posy's own packed attention kernel for batches of short sequences, CUDA only
and CUDA-graph safe; batches with a longer sequence go to the first of flashinfer (FA3 on Hopper, in
graph mode inside CUDA graphs), flash-attn (FA4) and torch-varlen (FA2) that runs and fits the model.

FlashAttention's varlen kernels give every (sequence, head) its own 128-row tiles, so a 50-token
sequence fills 39% of its query tile and of its key tile and a batch of short texts runs at a fraction
of the chip. This kernel tiles the packed token axis instead: a tile of queries may span several
sequences, it walks only the keys from the start of its first sequence to the end of its last, and a
key counts for a query only in the same sequence (segment ids), within the mask and window. Online
softmax in float32, exp2, as FlashAttention does.

Measured on the H200 (bf16, 12 heads, 16k-token batches): 50-token sequences 66 us against FA2's 98
(head dim 64) and 59 against 79 (head dim 32); one 128-token sequence 5.7 against 7.2; but mixed
16..512-token sequences 177 against 121 and 512-token ones 195 against 106, where FA2's long tiles
win. Hence the split at SHORT_SEQLEN, which reads meta.max_seqlen (a CUDA graph's length bucket, so
each graph is captured with one kernel or the other). Past it FA3 beats FlashAttention 2 on every mix
measured (per layer, H200: BERT-base's heads on 100 mixed 16..512-token texts 126 us against 190,
Qwen3-0.6B's grouped heads 193 against 624); at 128 tokens the three are within 15%.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from engine.attention.base import AttentionBackend, Window
from engine.attention.flash_attn_backend import flash_attn_backend
from engine.attention.flashinfer_backend import flashinfer_backend
from engine.attention.metadata import AttentionMetadata
from engine.attention.position_bias import PositionBias
from engine.attention.torch_varlen import torch_varlen_backend
from engine.errors import AttentionBackendUnavailable

LOG2_E = 1.4426950408889634
SHORT_SEQLEN = 128  # batches whose longest sequence is at most this run the packed kernel


class TritonAttention(AttentionBackend):
    name = "triton"
    graph_safe = True  # reads cu_seqlens and segment ids on the device, nothing on the host
    adds_position_bias = True  # reads the bias of each score's offset from a table
    head_dims = frozenset(range(16, 257, 16))
    dtypes = frozenset({torch.bfloat16, torch.float16})

    def __init__(self, kernel, long_sequences: tuple[Callable[[], AttentionBackend], ...] = ()) -> None:
        """`long_sequences`: factories of the backends for long batches, in order of preference; `check`
        builds them in turn (one raises AttentionBackendUnavailable where it cannot load) and keeps the
        first that fits, so a later one is never built where an earlier one fits (importing flash-attn-4
        alone takes 10 s, flashinfer takes a 128 MiB workspace)."""
        self._kernel = kernel
        self._factories = long_sequences
        self._built: dict[int, AttentionBackend | None] = {}  # by factory index; None: unavailable
        # runs batches with a sequence over SHORT_SEQLEN; None: this kernel runs every batch
        self.long_sequences: AttentionBackend | None = None

    def check(
        self,
        num_heads: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        dtype: torch.dtype | None = None,
        window: Window | None = None,
        position_bias: bool = False,
    ) -> None:
        super().check(num_heads, num_kv_heads, head_dim, dtype, window, position_bias)
        self.long_sequences = None  # unless a candidate fits, this kernel runs every batch of the model
        for index, factory in enumerate(self._factories):
            if index not in self._built:
                try:
                    self._built[index] = factory()
                except AttentionBackendUnavailable:
                    self._built[index] = None
            candidate = self._built[index]
            if candidate is None:
                continue
            try:
                candidate.check(num_heads, num_kv_heads, head_dim, dtype, window, position_bias)
            except AttentionBackendUnavailable:
                continue
            self.long_sequences = candidate
            break

    def runs_head_dim(self, head_dim: int) -> bool:
        # long sequences go to the long-sequence backend: it must run them too (FlashInfer has no 80)
        return super().runs_head_dim(head_dim) and (
            self.long_sequences is None or self.long_sequences.runs_head_dim(head_dim)
        )

    def describe(self) -> str:
        if self.long_sequences is None:
            return self.name
        return f"{self.name}, sequences over {SHORT_SEQLEN} tokens on {self.long_sequences.name}"

    @property
    def reads_key_layout(self) -> bool:  # shared prefixes run on the long-sequence backend
        return self.long_sequences is not None and self.long_sequences.reads_key_layout

    def prepare(
        self, meta: AttentionMetadata, cu_seqlens: torch.Tensor, key_cu_seqlens: torch.Tensor | None = None
    ) -> None:
        if self._hands_on(meta):
            self.long_sequences.prepare(meta, cu_seqlens, key_cu_seqlens)

    def _hands_on(self, meta: AttentionMetadata) -> bool:
        """Whether the long-sequence backend runs this batch: a sequence over SHORT_SEQLEN, or shared
        prefixes (their keys laid out apart from the queries)."""
        return self.long_sequences is not None and (meta.max_seqlen > SHORT_SEQLEN or meta.keys is not None)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: Window | None,
        scale: float | None = None,
        bias: PositionBias | None = None,
    ) -> torch.Tensor:
        # q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q
        if self._hands_on(meta):
            return self.long_sequences.forward(q, k, v, meta, causal, window, scale)
        num_tokens, num_heads, head_dim = q.shape
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if num_tokens == 0:
            return out
        left, right = window if window is not None else (-1, -1)
        if causal:
            right = 0
        num_slots = meta.cu_seqlens.shape[0] - 1
        tiles = tile_config(head_dim, meta.max_seqlen, num_tokens, num_slots)
        block_m, block_n, num_warps, num_stages, per_sequence = tiles
        qk_scale = LOG2_E * (1 / math.sqrt(head_dim) if scale is None else scale)
        programs = num_slots if per_sequence else triton_cdiv(num_tokens, block_m)
        grid = (programs, num_heads)
        # the table in exp2's units (a tiny multiply a layer: scaling each loaded bias inside the kernel
        # instead cost mpnet-base a fifth of its tokens/s on the H200); without a bias the kernel never
        # reads it, and q stands in for it
        table, max_offset = (bias.by_offset * LOG2_E, bias.max_offset) if bias is not None else (q, 0)
        self._kernel[grid](
            q, k, v, out, meta.segment_ids, meta.cu_seqlens, table,
            num_tokens, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), table.stride(0),
            num_heads // k.shape[1], head_dim, qk_scale, left, right, max_offset,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, 1 << (head_dim - 1).bit_length()),
            HAS_BIAS=bias is not None, PER_SEQUENCE=per_sequence, num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        return out


# one program a (sequence, head): the tiles, for batches whose sequences are at most PER_SEQUENCE_SEQLEN
# tokens and PER_SEQUENCE_MEAN on average (a CUDA graph's: its token bucket over its slots)
PER_SEQUENCE_SEQLEN = 64
PER_SEQUENCE_MEAN = 30
PER_SEQUENCE_TILES = (64, 32, 4, 2, True)


def tile_config(
    head_dim: int, max_seqlen: int, num_tokens: int, num_slots: int
) -> tuple[int, int, int, int, bool]:
    """(query rows, key rows, warps, pipeline stages, one program a sequence) per program, the fastest
    swept on the H200 (16k-token batches, bf16, per layer). One program a (sequence, head), its queries
    in one 64-row tile and each key and value read once, no segment ids read, where the sequences fill
    that tile: 50 tokens 43.5 us against 61.3 for the best tiles of the packed axis (BERT-base's heads),
    83 against 102 (Qwen3-0.6B's 16/8 heads, head dim 128), mixed 8..64 tokens (31 on average) 53.9
    against 62.4; but 20-token sequences 62.1 against 44.8. Otherwise tiles of the packed token axis:
    one-warp 16-row tiles for sequences of at most 64 tokens and head dims up to 64 (50 tokens: 60 us
    against 66 for 64-row tiles at head dim 64, 42 against 60 at 32; 20 tokens: 44 against 52), longer
    ones 64-row tiles (100 tokens: 83 against 86; one of 128: 5.7 against 5.9)."""
    if max_seqlen <= PER_SEQUENCE_SEQLEN and num_tokens >= PER_SEQUENCE_MEAN * num_slots:
        return PER_SEQUENCE_TILES
    if max_seqlen <= 64 and head_dim <= 64:
        return 16, 32, 1, 2, False
    return 64, 32, 4, 2, False


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def _triton_kernel():
    import triton
    import triton.language as tl

    # num_tokens changes with every batch: one compiled variant for all of them (Triton would otherwise
    # compile one for sizes that divide by 16 and one for those that do not, the first at a request)
    @triton.jit(do_not_specialize=["num_tokens"])
    def packed_attention(
        q_ptr, k_ptr, v_ptr, out_ptr, segment_ptr, cu_seqlens_ptr, bias_ptr,
        num_tokens, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        stride_bias_head, group_size, head_dim, qk_scale, window_left, window_right, max_offset,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr,
        PER_SEQUENCE: tl.constexpr,
    ):  # fmt: skip
        head = tl.program_id(1)
        kv_head = head // group_size
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < head_dim
        if PER_SEQUENCE:  # program 0 axis: a sequence slot, no longer than BLOCK_M (empty slots: none)
            key_start = tl.load(cu_seqlens_ptr + tl.program_id(0))
            key_end = tl.load(cu_seqlens_ptr + tl.program_id(0) + 1)
            first_row = key_start
            rows = first_row + tl.arange(0, BLOCK_M)
            row_mask = rows < key_end
            last_row = key_end - 1
        else:  # a tile of the packed token axis, which may span sequences
            first_row = tl.program_id(0) * BLOCK_M
            rows = first_row + tl.arange(0, BLOCK_M)
            row_mask = rows < num_tokens
            # the keys this tile can see: from its first sequence's start to its last sequence's end
            last_row = tl.minimum(first_row + BLOCK_M, num_tokens) - 1
            key_start = tl.load(cu_seqlens_ptr + tl.load(segment_ptr + first_row))
            key_end = tl.load(cu_seqlens_ptr + tl.load(segment_ptr + last_row) + 1)
        if window_right >= 0:
            key_end = tl.minimum(key_end, last_row + window_right + 1)
        if window_left >= 0:
            key_start = tl.maximum(key_start, first_row - window_left)
        if not PER_SEQUENCE:  # a program's keys are its one sequence's in PER_SEQUENCE: no ids to compare
            segments = tl.load(segment_ptr + rows, mask=row_mask, other=-1)
        q = tl.load(
            q_ptr + rows.to(tl.int64)[:, None] * stride_qt + head * stride_qh + dims[None, :],
            mask=row_mask[:, None] & dim_mask[None, :],
            other=0.0,
        )
        row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        for block_start in range(key_start, key_end, BLOCK_N):
            keys = block_start + tl.arange(0, BLOCK_N)
            key_mask = keys < key_end
            k = tl.load(
                k_ptr + keys.to(tl.int64)[:, None] * stride_kt + kv_head * stride_kh + dims[None, :],
                mask=key_mask[:, None] & dim_mask[None, :],
                other=0.0,
            )
            v = tl.load(  # issued with k, so that its latency hides behind the scores
                v_ptr + keys.to(tl.int64)[:, None] * stride_vt + kv_head * stride_vh + dims[None, :],
                mask=key_mask[:, None] & dim_mask[None, :],
                other=0.0,
            )
            scores = tl.dot(q, tl.trans(k)) * qk_scale
            if HAS_BIAS:  # the table's column of each key's offset from its query
                offsets = tl.minimum(tl.maximum(keys[None, :] - rows[:, None], -max_offset), max_offset)
                scores += tl.load(bias_ptr + head * stride_bias_head + offsets + max_offset)
            if PER_SEQUENCE:
                allowed = tl.broadcast_to(key_mask[None, :], (BLOCK_M, BLOCK_N))
            else:
                key_segments = tl.load(segment_ptr + keys, mask=key_mask, other=-2)
                allowed = segments[:, None] == key_segments[None, :]
            if window_right >= 0:
                allowed &= keys[None, :] <= rows[:, None] + window_right
            if window_left >= 0:
                allowed &= keys[None, :] >= rows[:, None] - window_left
            scores = tl.where(allowed, scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, axis=1))
            safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
            probabilities = tl.math.exp2(scores - safe_max[:, None])
            rescale = tl.math.exp2(row_max - safe_max)
            row_sum = row_sum * rescale + tl.sum(probabilities, axis=1)
            acc = acc * rescale[:, None] + tl.dot(probabilities.to(v.dtype), v)
            row_max = new_max
        acc = acc / tl.where(row_sum == 0.0, 1.0, row_sum)[:, None]
        tl.store(
            out_ptr + rows.to(tl.int64)[:, None] * stride_ot + head * stride_oh + dims[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & dim_mask[None, :],
        )

    return packed_attention


def triton_backend(device: torch.device) -> TritonAttention:
    if device.type != "cuda":
        raise AttentionBackendUnavailable("needs a CUDA device")
    if not torch.cuda.is_available():
        raise AttentionBackendUnavailable("CUDA is not available")
    try:
        kernel = _triton_kernel()
    except ImportError as error:
        raise AttentionBackendUnavailable(f"triton cannot be imported: {error}") from error
    factories = (flashinfer_backend, flash_attn_backend, torch_varlen_backend)
    return TritonAttention(kernel, tuple(functools.partial(factory, device) for factory in factories))
