"""`python -m benchmarks.variants [attention] [host] [tiles] [gemm] [prefixes]` (CUDA): the variants
behind the engine's choices, side by side in one device call; printed, not recorded.

attention: microseconds a layer (CUDA-graph replays, median) of each attention backend that loads here:
FlashAttention 2 (torch-varlen), triton's packed kernel on every length, FA3 (flashinfer, in graph mode
as the engine's graphs run it) and FA4 (flash-attn), on BERT-base's and Qwen3-0.6B's heads at the
lengths of the kernel issue's cases; each output against FlashAttention 2's (relative error), and
flashinfer's host time to plan and launch a new batch.
host: where ModelRunner.step's host time goes on a graph replay (pack, stage, prepare, input copy,
replay launch, LazyTensor set-up, then the wait; and the side-stream set-up LazyTensor had before
HostBuffers), BERT-base and Qwen3-0.6B shapes.
tiles: triton's packed kernel on short sequences in each of a few tiles, one program a sequence or not.
gemm: the layer GEMMs at small M, cuBLAS against a plain Triton tile kernel.
prefixes: a causal judge's request (Qwen3-Reranker-0.6B's shape, the default engine config, lazy CUDA
graphs) as continuations of its shared prefix against whole sequences, over prefix, passage and document
counts: the data behind engine/prefixes.py's rule."""

from __future__ import annotations

import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# name -> (query heads, key/value heads, head dim, causal, lengths)
MIXED = np.random.default_rng(2).integers(16, 513, 100).tolist()
ATTENTION_SHAPES = {
    "bert-1x128": (12, 12, 64, False, [128]),
    "bert-327x50": (12, 12, 64, False, [50] * 327),
    "bert-5x512": (12, 12, 64, False, [512] * 5),
    "bert-50x512": (12, 12, 64, False, [512] * 50),
    "bert-mixed100": (12, 12, 64, False, MIXED),
    "qwen3-1x128": (16, 8, 128, True, [128]),
    "qwen3-1x4096": (16, 8, 128, True, [4096]),
    "qwen3-50x512": (16, 8, 128, True, [512] * 50),
    "qwen3-mixed100": (16, 8, 128, True, MIXED),
}
HOST_CASES = {"bert-base": ([128], [512] * 50), "qwen3-0.6b": ([128], [4096], [512] * 50)}


def microseconds(function) -> float:
    from triton.testing import do_bench_cudagraph

    return 1000 * do_bench_cudagraph(function, rep=40, return_mode="median")


def relative_error(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def layer_microseconds(backend, q, k, v, meta, causal: bool) -> float:
    from engine.attention import varlen_attention

    return microseconds(lambda: varlen_attention(q, k, v, meta, backend=backend, causal=causal))


def attention() -> None:
    import torch

    from engine.attention import AttentionMetadata, select_backend, varlen_attention
    from engine.errors import AttentionBackendUnavailable

    for case, (num_heads, num_kv_heads, head_dim, causal, lengths) in ATTENTION_SHAPES.items():
        shape = {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
        cu_seqlens = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
        meta = AttentionMetadata.build(cu_seqlens, max(lengths)).to("cuda")
        q, k, v = (
            torch.randn(sum(lengths), heads, head_dim, device="cuda", dtype=torch.bfloat16)
            for heads in (num_heads, num_kv_heads, num_kv_heads)
        )
        row: dict[str, str] = {}
        reference = None
        for name in ("torch-varlen", "triton-packed", "flashinfer", "flash-attn"):
            try:
                backend = select_backend(name.removesuffix("-packed"), "cuda", dtype=torch.bfloat16, **shape)
            except AttentionBackendUnavailable:
                continue
            if name == "triton-packed":
                if max(lengths) > 1024:
                    continue
                backend.long_sequences = None  # the packed kernel on every length
            if name == "flashinfer":
                # the host's plan (and launch) for a new batch, timed on the eager path's second batch
                for _ in range(2):
                    fresh = AttentionMetadata.build(cu_seqlens, max(lengths)).to("cuda")
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                    varlen_attention(q, k, v, fresh, backend=backend, causal=causal)
                row["fa3 plan"] = f"{1000 * (time.perf_counter() - started):.2f} ms"
                backend.prepare(meta, cu_seqlens)  # then graph mode, as inside the engine's graphs
            out = varlen_attention(q, k, v, meta, backend=backend, causal=causal)
            reference = out if reference is None else reference
            us = layer_microseconds(backend, q, k, v, meta, causal)
            row[name] = f"{us:.1f} us (error {relative_error(out, reference):.0e})"
        print(f"{case}: " + ", ".join(f"{name} {value}" for name, value in row.items()), flush=True)


def host() -> None:
    import torch

    from benchmarks.checkpoints import save_bert, save_qwen3
    from benchmarks.engine import random_sequences
    from engine.batch import pack
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig
    from engine.cuda_graphs import host_cu_seqlens, stage
    from engine.lazy import LazyTensor

    labels = ("pack", "key", "stage", "prepare", "copy", "replay", "lazy", "wait", "side-stream lazy")
    copy_stream = torch.cuda.Stream()
    for shape, cases in HOST_CASES.items():
        save = save_bert if shape == "bert-base" else save_qwen3
        checkpoint = save(Path(tempfile.mkdtemp()), shape)
        config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=32768, max_queue_tokens=2**21)
        engine = build_engine(resolve_model(str(checkpoint.folder)), config)
        runner, graphs = engine.runner, engine.runner.graphs
        try:
            with torch.inference_mode():
                for lengths in cases:
                    sequences = random_sequences(lengths, 1)
                    for _ in range(4):  # eager, capture, replays
                        runner.step(pack(sequences)).result()
                    samples = []
                    for _ in range(40):
                        torch.cuda.synchronize()
                        times = [time.perf_counter()]
                        batch = pack(sequences)
                        times.append(time.perf_counter())
                        key = graphs.key(batch)
                        graph = graphs.graphs[key]
                        graph.staged.synchronize()
                        times.append(time.perf_counter())
                        staged = stage(batch, key, out=graph.staging.numpy())
                        times.append(time.perf_counter())
                        graphs.attention.prepare(graph.inputs.meta, host_cu_seqlens(staged, key))
                        times.append(time.perf_counter())
                        graph.inputs.ints.copy_(graph.staging, non_blocking=True)
                        graph.staged.record()
                        times.append(time.perf_counter())
                        graph.graph.replay()
                        times.append(time.perf_counter())
                        rows = LazyTensor(graph.output[: batch.num_seqs], runner.host_buffers)
                        times.append(time.perf_counter())
                        rows.result()
                        times.append(time.perf_counter())
                        side_stream_copy(graph.output[: batch.num_seqs], copy_stream)
                        times.append(time.perf_counter())
                        samples.append(np.diff(times))
                    medians = (1000 * statistics.median(column) for column in zip(*samples))
                    pieces = ", ".join(f"{label} {ms:.3f}" for label, ms in zip(labels, medians))
                    print(f"{shape} {len(lengths)}x{max(lengths)}: {pieces} ms", flush=True)
        finally:
            engine.stop()


# short-sequence batches (name -> query heads, key/value heads, head dim, lengths) and triton's tiles for
# them: (query rows, key rows, warps, stages, one program a sequence)
TILE_SHAPES = {
    "bert-327x50": (12, 12, 64, [50] * 327),
    "bert-819x20": (12, 12, 64, [20] * 819),
    "bert-mixed16k": (12, 12, 64, np.random.default_rng(3).integers(8, 65, 520).tolist()),
    "qwen3-327x50": (16, 8, 128, [50] * 327),
}
TILES = [None, (64, 32, 4, 2, True), (64, 64, 4, 1, True), (16, 32, 1, 2, False), (64, 32, 4, 2, False)]


def tiles() -> None:
    """Triton's packed kernel on batches of short sequences (16k tokens, CUDA-graph replays) in the tile
    the engine picks (None), then each tile of TILES, against the first one's output."""
    import torch

    from engine.attention import AttentionMetadata, select_backend
    from engine.attention import triton_backend as module

    chosen = module.tile_config
    try:
        for case, (num_heads, num_kv_heads, head_dim, lengths) in TILE_SHAPES.items():
            shape = {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
            backend = select_backend("triton", "cuda", dtype=torch.bfloat16, **shape)
            cu_seqlens = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
            meta = AttentionMetadata.build(cu_seqlens, max(lengths)).to("cuda")
            q, k, v = (
                torch.randn(sum(lengths), heads, head_dim, device="cuda", dtype=torch.bfloat16)
                for heads in (num_heads, num_kv_heads, num_kv_heads)
            )
            row, reference = [], None
            for tile in TILES:
                module.tile_config = chosen if tile is None else (lambda *shape, tile=tile: tile)
                out = backend.forward(q, k, v, meta, False, None)
                reference = out if reference is None else reference
                us = layer_microseconds(backend, q, k, v, meta, False)
                label = tile or f"engine's {chosen(head_dim, max(lengths), sum(lengths), len(lengths))}"
                row.append(f"{label} {us:.1f} us ({relative_error(out, reference):.0e})")
            print(f"{case}: " + ", ".join(row), flush=True)
    finally:
        module.tile_config = chosen


# (name, M, N, K): the layer GEMMs of BERT-base, XLM-R large (BGE-M3) and Qwen3-0.6B (pplx-embed) at one
# 128-token text, and BERT's at 5 x 512
GEMM_SHAPES = [
    *((f"bert-{name}", 128, n, k) for name, n, k in (("qkv", 2304, 768), ("o", 768, 768), ("up", 3072, 768),
                                                     ("down", 768, 3072))),
    *((f"xlmr-large-{name}", 128, n, k) for name, n, k in (("qkv", 3072, 1024), ("o", 1024, 1024),
                                                           ("up", 4096, 1024), ("down", 1024, 4096))),
    *((f"qwen3-{name}", 128, n, k) for name, n, k in (("qkv", 4096, 1024), ("o", 1024, 2048),
                                                      ("gate_up", 6144, 1024), ("down", 1024, 3072))),
    *((f"bert-{name}-2560", 2560, n, k) for name, n, k in (("qkv", 2304, 768), ("down", 768, 3072))),
]  # fmt: skip


def _linear_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def linear(x, w, b, out, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # out [M, N] = x [M, K] @ w [N, K]^T + b, K a multiple of BLOCK_K
        rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = tl.load(x + rm[:, None] * K + (k + rk)[None, :], mask=rm[:, None] < M, other=0.0)
            t = tl.load(w + rn[None, :] * K + (k + rk)[:, None], mask=rn[None, :] < N, other=0.0)
            acc = tl.dot(a, t, acc)
        acc += tl.load(b + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(out + rm[:, None] * N + rn[None, :], acc.to(out.dtype.element_ty), mask=mask)

    return linear


def _split_k_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def split_k(x, w, acc_out, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                SPLIT: tl.constexpr):  # fmt: skip
        # acc_out [M, N] (float32, zeroed) += x [M, K/SPLIT part] @ w [N, K/SPLIT part]^T
        rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        part = K // SPLIT
        rk = tl.program_id(2) * part + tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, part, BLOCK_K):
            a = tl.load(x + rm[:, None] * K + (k + rk)[None, :], mask=rm[:, None] < M, other=0.0)
            t = tl.load(w + rn[None, :] * K + (k + rk)[:, None], mask=rn[None, :] < N, other=0.0)
            acc = tl.dot(a, t, acc)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.atomic_add(acc_out + rm[:, None] * N + rn[None, :], acc, mask=mask, sem="relaxed")

    return split_k


def gemm(prefixes: tuple[str, ...] = ("",)) -> None:
    """The layer GEMMs at small M (those whose names start with one of `prefixes`): cuBLAS through F.linear
    (torch's default library, then cuBLASLt asked for), a plain Triton tile kernel over a few tile shapes
    and a split-K one (their best), each against its weight-read floor (4.8 TB/s)."""
    import torch
    import torch.nn.functional as F

    kernel = _linear_kernel()
    configs = [(bm, bn, bk, warps, stages) for bm in (64, 128) for bn in (16, 32, 64) for bk in (64, 128)
               for warps in (4,) for stages in (3,)]  # fmt: skip
    for name, m, n, k in (shape for shape in GEMM_SHAPES if shape[0].startswith(prefixes)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        want = F.linear(x, w, b)
        row = {"floor": 2 * n * k / 4.8e6}
        row["cublas"] = microseconds(lambda x=x, w=w, b=b: F.linear(x, w, b))
        default = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        row["cublaslt"] = microseconds(lambda x=x, w=w, b=b: F.linear(x, w, b))
        torch.backends.cuda.preferred_blas_library(default)
        best, best_config, error = float("inf"), None, None
        out = torch.empty_like(want)
        for bm, bn, bk, warps, stages in configs:
            launch = kernel[(-(-n // bn), -(-m // bm))]
            run = functools.partial(
                launch, x, w, b, out, m, n, k, bm, bn, bk, num_warps=warps, num_stages=stages
            )
            try:
                run()
                us = microseconds(run)
            except Exception as failure:  # a tile that does not fit the SM's shared memory
                print(f"{name}: triton {bm}x{bn}x{bk} failed: {type(failure).__name__}", flush=True)
                continue
            if us < best:
                best, best_config, error = us, (bm, bn, bk, stages), relative_error(out, want)
        row[f"triton {best_config}"] = best
        # split-K: more programs stream the weight at once; a zeroed float32 sum, then the cast and bias
        split_k = _split_k_kernel()
        total = torch.empty(m, n, device="cuda", dtype=torch.float32)
        best, best_config = float("inf"), None
        for bm, bn, bk, split, stages in [
            (bm, bn, bk, split, 3) for bm in (64, 128) for bn in (32, 64) for bk in (64, 128)
            for split in (2, 4, 8) if k % (split * bk) == 0
        ]:  # fmt: skip
            launch = functools.partial(
                split_k[(-(-n // bn), -(-m // bm), split)], x, w, total, m, n, k, bm, bn, bk, split,
                num_warps=4, num_stages=stages,
            )  # fmt: skip

            def run(launch=launch, total=total, b=b, out=out):
                total.zero_()
                launch()
                torch.add(total, b, out=out)

            try:
                run()
                us = microseconds(run)
            except Exception as failure:
                print(f"{name}: split-K {bm}x{bn}x{bk}/{split} failed: {type(failure).__name__}", flush=True)
                continue
            if us < best:
                best, best_config, error_k = us, (bm, bn, bk, split, stages), relative_error(out, want)
        if best_config is not None:
            row[f"split-K {best_config} (error {error_k:.0e})"] = best
        values = ", ".join(f"{label} {us:.1f}" for label, us in row.items())
        print(f"{name} ({m}x{n}x{k}): {values} us (triton error {error:.0e})", flush=True)


def side_stream_copy(rows, stream) -> None:
    """LazyTensor's set-up before HostBuffers, for comparison: a fresh pinned buffer, a side stream and
    its bookkeeping."""
    import torch

    host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        host.copy_(rows, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(stream)
    rows.record_stream(stream)
    torch.cuda.current_stream().wait_event(copied)


# (prefix tokens, passages, passage tokens)
PREFIX_CASES = [(p, n, s) for p in (20, 60, 120) for n in (2, 5, 50) for s in (30, 150, 400)]


def prefixes() -> None:
    import asyncio

    from benchmarks.checkpoints import save_qwen3
    from benchmarks.engine import random_sequences
    from benchmarks.timing import timed
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import sized_for
    from engine.outputs import RowRequest

    spec = resolve_model(str(save_qwen3(Path(tempfile.mkdtemp()), "qwen3-0.6b", "judge").folder))
    engine = build_engine(spec, sized_for(spec.max_seq_length, "cuda", "bfloat16"))
    loop = asyncio.new_event_loop()

    def p50_ms(*args, **options) -> float:
        def run():
            return loop.run_until_complete(engine.run(*args, **options))

        for _ in range(3):  # eager, capture, replay
            run()
        return 1000 * statistics.median(timed(run, 15, "cuda"))

    try:
        for seed, (prefix_length, num_passages, passage_length) in enumerate(PREFIX_CASES):
            prefix = random_sequences([prefix_length], 2 * seed)[0]
            passages = random_sequences([passage_length] * num_passages, 2 * seed + 1)
            shared = p50_ms(passages, rows=RowRequest(prefix=prefix))
            whole = p50_ms([prefix + passage for passage in passages])
            saved = (num_passages - 1) * prefix_length / (num_passages * (prefix_length + passage_length))
            case = f"prefix {prefix_length} + {num_passages} x {passage_length}"
            print(
                f"{case}: saves {saved:.1%} of the tokens; shared {shared:.2f} ms, whole {whole:.2f} ms, "
                f"{whole / shared:.2f}x",
                flush=True,
            )
    finally:
        engine.stop()
        loop.close()


def main(argv: list[str]) -> None:
    parts = {"attention": attention, "host": host, "tiles": tiles, "gemm": gemm, "prefixes": prefixes}
    for part in argv or ["attention", "host", "tiles", "gemm"]:
        name, _, shapes = part.partition("=")  # gemm=xlmr-large,qwen3: the shapes whose names start so
        parts[name](*([tuple(shapes.split(","))] if shapes else []))


if __name__ == "__main__":
    main(sys.argv[1:])
