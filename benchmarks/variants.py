"""`python -m benchmarks.variants [attention] [host] [fill]` (CUDA): the variants behind the engine's choices,
side by side in one device call; printed, not recorded.

attention: microseconds a layer (CUDA-graph replays, median) of each attention backend that loads here:
FlashAttention 2 (torch-varlen), triton's packed kernel on every length, FA3 (flashinfer, in graph mode
as the engine's graphs run it) and FA4 (flash-attn), on BERT-base's and Qwen3-0.6B's heads at the
lengths of the kernel issue's cases; each output against FlashAttention 2's (relative error), and
flashinfer's host time to plan and launch a new batch.
host: where ModelRunner.step's host time goes on a graph replay (pack, stage, prepare, input copy,
replay launch, LazyTensor set-up, then the wait; and the side-stream set-up LazyTensor had before
HostBuffers), BERT-base and Qwen3-0.6B shapes.
fill: rerank latency with and without the scheduler's pipeline fill."""

from __future__ import annotations

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
    from engine.config import EngineConfig
    from engine.cuda_graphs import host_cu_seqlens, stage
    from engine.lazy import LazyTensor
    from engine.loader import resolve_model

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


def fill() -> None:
    """A rerank request's p50 with the pipeline fill (an idle device's first batch takes half the queue)
    and without it, BERT-base cross-encoder and Qwen3-Reranker shapes, 25 and 50 x 512, one engine each."""
    import asyncio
    import dataclasses
    import random

    import torch

    from benchmarks.checkpoints import save_bert, save_qwen3, words
    from benchmarks.scoring import rerank_model
    from benchmarks.timing import timed
    from engine.build import build_engine
    from engine.config import EngineConfig
    from engine.loader import resolve_model
    from scoring.rerank import RerankOptions, rerank_scores

    loop = asyncio.new_event_loop()
    base = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=32768, max_queue_tokens=2**21)
    for kind, save, shape in (("cross-encoder", save_bert, "bert-base"), ("judge", save_qwen3, "qwen3-0.6b")):
        checkpoint = save(Path(tempfile.mkdtemp()), shape, kind)
        spec = resolve_model(str(checkpoint.folder))
        for fill_tokens in (base.pipeline_fill_tokens, 0):
            engine = build_engine(spec, dataclasses.replace(base, pipeline_fill_tokens=fill_tokens))
            tokenizer, model = rerank_model(engine, checkpoint.folder, kind, spec.max_seq_length)
            rng = random.Random(2)
            query = tokenizer.encode(model.prompts.query_text(words(12, rng)), add_special_tokens=False).ids
            length = 512 - len(query) - model.pair.num_special_tokens
            try:
                for num_documents in (25, 50):
                    texts = [model.prompts.document_text(words(length, rng)) for _ in range(num_documents)]
                    docs = [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]

                    def score(model=model, query=query, docs=docs):
                        return loop.run_until_complete(rerank_scores(model, query, docs, RerankOptions()))

                    for _ in range(4):  # eager, capture, replays
                        score()
                    p50 = 1000 * float(np.median(timed(score, 30, "cuda")))
                    case = f"{shape} {kind} {num_documents}x512, fill {fill_tokens}"
                    print(f"{case}: p50 {p50:.2f} ms", flush=True)
            finally:
                engine.stop()
                torch.cuda.empty_cache()
    loop.close()


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


def main(argv: list[str]) -> None:
    for part in argv or ["attention", "host", "fill"]:
        {"attention": attention, "host": host, "fill": fill}[part]()


if __name__ == "__main__":
    main(sys.argv[1:])
