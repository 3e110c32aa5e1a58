"""Kernel comparisons behind the engine's choices (CUDA), part of the engine suite: the packed Triton
attention against FlashAttention 2 (torch varlen_attn) by length mix, and the up projection with its
GELU in the cuBLASLt epilogue against the GEMM and a separate erf GELU. Timed as CUDA-graph replays
(triton.testing.do_bench_cudagraph, median), BERT-base shapes, bf16."""

from __future__ import annotations

import numpy as np

from benchmarks.records import Record, RunContext

HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE = 12, 64, 768, 3072


def _microseconds(function) -> float:
    from triton.testing import do_bench_cudagraph

    return 1000 * do_bench_cudagraph(function, rep=40, return_mode="median")


def attention_records(context: RunContext) -> list[Record]:
    import torch

    from engine.attention import AttentionMetadata, select_backend

    rng = np.random.default_rng(0)
    mixed = rng.integers(16, 513, 200).tolist()
    while sum(mixed) > 16384:
        mixed.pop()
    mixes = {"attention-50tok-16k": [50] * 327, "attention-mixed-16k": mixed, "attention-1x128": [128]}
    shape = {"num_heads": HEADS, "num_kv_heads": HEADS, "head_dim": HEAD_DIM, "dtype": torch.bfloat16}
    packed = select_backend("triton", "cuda", **shape)
    packed.long_sequences = None  # the packed kernel on every mix, long sequences included
    flash = select_backend("torch-varlen", "cuda", **shape)
    records = []
    for case, lengths in mixes.items():
        cu_seqlens = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
        meta = AttentionMetadata.build(cu_seqlens, max(lengths)).to("cuda")
        qkv = torch.randn(sum(lengths), 3, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        ours, theirs = (_attention_microseconds(backend, qkv, meta) for backend in (packed, flash))
        records.append(context.record(case, "packed_kernel_us", ours, "us", theirs))
    return records


def _attention_microseconds(backend, qkv, meta) -> float:
    from engine.attention import varlen_attention

    q, k, v = qkv.unbind(1)  # BERT's layout: views into one fused projection
    return _microseconds(lambda: varlen_attention(q, k, v, meta, backend=backend))


def gelu_epilogue_records(context: RunContext) -> list[Record]:
    import torch
    import torch.nn.functional as F

    from engine.layers.linear_act import LinearActivation

    layer = LinearActivation(HIDDEN, INTERMEDIATE, "gelu").to("cuda", torch.bfloat16)
    records = []
    for num_tokens in (128, 16384):
        x = torch.randn(num_tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            fused = _microseconds(lambda x=x: layer(x))
            unfused = _microseconds(lambda x=x: F.gelu(F.linear(x, layer.weight, layer.bias)))
        records.append(context.record(f"up-gelu-{num_tokens}", "fused_epilogue_us", fused, "us", unfused))
    return records
