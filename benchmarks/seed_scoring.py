"""The seed suite's scoring part: one query and 5, 25 and 50 documents, 512 tokens a (query, document) pair,
on a bge-reranker-v2-m3 shape (an XLM-R large cross-encoder) and a Qwen3-Reranker-0.6B shape (the judge):
/v2/rerank through HTTP (one client, back to back; tokenization included), the rerank path on the engine
alone, and HF on the same token ids. The XLM-R large case is held to its bf16 compute floor (its FLOPs over
the card's dense bf16 peak: about 17 TFLOP a 50-document request), and runs in FP8 too, where FP8 pays
(else the engine says why it runs in bf16)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.baseline import Baseline
from benchmarks.load import run_clients
from benchmarks.records import Record, RunContext
from benchmarks.scoring import rerank_model
from benchmarks.seed_models import SeedModel, real_shape
from benchmarks.seed_table import TARGETS
from benchmarks.seed_texts import TextMaker
from benchmarks.timing import timed

NUM_DOCUMENTS = (5, 25, 50)
PAIR_TOKENS, SMOKE_PAIR_TOKENS = 512, 128  # the judge's prompt alone takes about 80
QUERY_TOKENS = 12
MAX_SCORE_ERROR = 1e-2  # posy in bf16 (or FP8) against the baseline in fp32
# dense bf16 tensor-core peaks, by the card's name (H100 SXM and H200 share the H100's compute)
BF16_PEAK_FLOPS = {"H100": 989.4e12, "H200": 989.4e12}
SERVED_NAME = "bench"


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    query: str
    documents: list[str]
    query_ids: list[int]
    docs_ids: list[list[int]]  # each cut to what its pair leaves it
    pairs: list[tuple[list[int], list[int]]]  # the engine's (ids, token types) a pair, for HF


def measure_scoring(
    options,
    model: SeedModel,
    tokenizers: Path | None,
    device: str,
    gpu: str | None,
    smoke: bool,
    sentences: Sequence[str] = (),
) -> tuple[list[Record], list[str]]:
    import torch

    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import sized_for

    dtype, dtype_name = (torch.float32, "float32") if smoke else (torch.bfloat16, "bfloat16")
    repeats = 5 if smoke else 20 * options.rounds
    records: list[Record] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = model.save(Path(folder), real_shape(smoke, model.shape), tokenizers, device)
        spec = resolve_model(str(checkpoint.folder))
        baseline = Baseline(checkpoint, device, dtype)
        model_name = f"{model.name} shape (random weights)"
        context = RunContext(suite=options.suite, model=model_name, gpu=gpu, backend="unknown")
        cases: list[Case] = []
        engine_p50: dict[tuple[str, str], float] = {}
        quantizations = ("none", "fp8") if model.kind == "cross-encoder" and not smoke else ("none",)
        for quantization in quantizations:
            cuda_graphs = "off" if smoke else "lazy"
            config = sized_for(
                spec.max_seq_length, device, dtype_name, options.backend, cuda_graphs,
                quantization=quantization,
            )  # fmt: skip
            engine = build_engine(spec, config)
            context = dataclasses.replace(context, backend=engine.attention_backend)
            try:
                tokenizer, rerank = rerank_model(engine, checkpoint.folder, model.kind, spec.max_seq_length)
                cases = cases or made_cases(
                    model.name, rerank, tokenizer, baseline.tokenizer, smoke, sentences
                )
                for case in cases:
                    label = case.name if quantization == "none" else f"{case.name}-fp8"
                    p50, error = engine_case(rerank, baseline, case, repeats, device, dtype)
                    records.append(context.record(label, "max_score_error_vs_fp32", error, "probability"))
                    if error > MAX_SCORE_ERROR:
                        failures.append(f"{label}: score error {error:.4f} > {MAX_SCORE_ERROR}")
                        continue
                    engine_p50[case.name, quantization] = p50
                    records.append(context.record(f"{label}-engine", "latency_p50_ms", p50, "ms"))
                    print(f"{label}: engine p50 {p50:.2f} ms, max score error {error:.5f}")
                if quantization == "fp8":
                    records += fp8_records(context, engine, engine_p50, cases)
            finally:
                engine.stop()
        records += hf_records(context, baseline, cases, engine_p50, device, repeats)
        records += http_records(
            context, checkpoint.folder, cases, device, dtype_name, options.backend, smoke, failures
        )
        if model.kind == "cross-encoder" and gpu is not None:
            records += floor_records(context, checkpoint.reference.config, cases, records, gpu)
    return records, failures


def made_cases(
    name: str, rerank, tokenizer, hf_tokenizer, smoke: bool, sentences: Sequence[str] = ()
) -> list[Case]:
    """A query and NUM_DOCUMENTS documents each, every pair PAIR_TOKENS long after templating."""
    pair_tokens = SMOKE_PAIR_TOKENS if smoke else PAIR_TOKENS
    texts = TextMaker(hf_tokenizer, 0, random.Random(3), sentences)
    cases = []
    for num_documents in NUM_DOCUMENTS:
        query = texts.text(QUERY_TOKENS)
        query_ids = tokenizer.encode(rerank.prompts.query_text(query), add_special_tokens=False).ids
        room = pair_tokens - len(query_ids) - rerank.pair.num_special_tokens
        documents = texts.texts(room, num_documents)
        docs_ids = [
            tokenizer.encode(rerank.prompts.document_text(document), add_special_tokens=False).ids[:room]
            for document in documents
        ]
        pairs = [rerank.pair.apply(query_ids, ids) for ids in docs_ids]
        cases.append(
            Case(f"{name}-{num_documents}x{pair_tokens}", query, documents, query_ids, docs_ids, pairs)
        )
    return cases


def engine_case(rerank, baseline, case: Case, repeats: int, device: str, dtype) -> tuple[float, float]:
    """(p50 ms of the rerank path on the engine, max score error against the fp32 baseline)."""
    import torch

    from scoring.rerank import RerankOptions, rerank_scores

    loop = asyncio.new_event_loop()
    try:

        def score() -> np.ndarray:
            return loop.run_until_complete(
                rerank_scores(rerank, case.query_ids, case.docs_ids, RerankOptions())
            )

        for _ in range(3):  # eager, capture, replay
            scores = score()
        ids, types = [ids for ids, _ in case.pairs], [types for _, types in case.pairs]
        reference = baseline.to(torch.float32).score_ids(ids, types)
        baseline.to(dtype)
        error = float(np.abs(scores - reference).max())
        return 1000 * float(np.median(timed(score, repeats, device))), error
    finally:
        loop.close()


def hf_records(context, baseline, cases: list[Case], engine_p50, device, repeats) -> list[Record]:
    """HF on the engine's pairs, one padded pass of the batch: the engine records' baselines."""
    records = []
    for case in cases:
        ids, types = [ids for ids, _ in case.pairs], [types for _, types in case.pairs]

        def score(ids: list = ids, types: list = types) -> None:
            baseline.score_ids(ids, types)

        timed(score, 2, device)
        hf = 1000 * float(np.median(timed(score, max(3, repeats // 4), device)))
        posy = engine_p50.get((case.name, "none"))
        if posy is not None:
            records.append(context.record(f"{case.name}-engine-vs-hf", "latency_p50_ms", posy, "ms", hf))
        print(f"{case.name}: HF p50 {hf:.2f} ms")
    return records


def http_records(context, folder, cases, device, dtype_name, backend, smoke, failures) -> list[Record]:
    from benchmarks.live_server import serve, served_backend

    flags = ("--device", device, "--dtype", dtype_name, "--attention-backend", backend,
             "--served-model-name", SERVED_NAME)  # fmt: skip
    records = []
    with serve(folder, *flags) as url:
        context = dataclasses.replace(context, backend=served_backend(url))
        for case in cases:
            body = json.dumps(
                {"model": SERVED_NAME, "query": case.query, "documents": case.documents}
            ).encode()
            window, warmup = (0.5, 0.1) if smoke else (4.0, 1.0)
            load = run_clients(url, [[body]], duration_s=window, warmup_s=warmup, path="/v2/rerank")
            p50, p99 = load.latency_ms(50), load.latency_ms(99)
            records += [
                context.record(case.name, "latency_p50_ms", p50, "ms"),
                context.record(case.name, "latency_p99_ms", p99, "ms"),
                context.record(case.name, "errors", len(load.errors), "requests"),
            ]
            print(
                f"{case.name}: HTTP /v2/rerank p50 {p50:.2f} ms, p99 {p99:.2f} ms, {len(load.errors)} errors"
            )
            if load.errors:
                failures.append(f"{case.name}: {len(load.errors)} failed requests: {load.errors[0]}")
    return records


def fp8_records(context, engine, engine_p50, cases) -> list[Record]:
    from engine.layers.fp8 import fp8_layers

    if not fp8_layers(engine.runner.model):
        print("FP8: the engine found it faster at no batch size on this card and runs in bf16 (its log says "
              "where it measured)")  # fmt: skip
        return [context.record(f"{cases[-1].name}-fp8", "fp8_runs", 0.0, "bool")]
    records = [context.record(f"{cases[-1].name}-fp8", "fp8_runs", 1.0, "bool")]
    for case in cases:
        bf16, fp8 = engine_p50.get((case.name, "none")), engine_p50.get((case.name, "fp8"))
        if bf16 and fp8:
            records.append(context.record(f"{case.name}-fp8", "speedup_vs_bf16", bf16 / fp8, "x"))
            print(f"{case.name}: FP8 {bf16 / fp8:.2f}x bf16 on the engine (target >= 1.3x)")
    return records


def floor_records(context, config, cases, records, gpu: str) -> list[Record]:
    """The 50-document case's HTTP p50 over its bf16 compute floor."""
    peak = next((flops for card, flops in BF16_PEAK_FLOPS.items() if card in gpu), None)
    case = cases[-1].name
    if peak is None:
        print(f"{case}: no bf16 peak known for {gpu}: no compute floor")
        return []
    flops = request_flops(config, len(cases[-1].pairs), len(cases[-1].pairs[0][0]))
    floor_ms = 1000 * flops / peak
    http_p50 = next(r.value for r in records if r.case == case and r.metric == "latency_p50_ms")
    ratio = http_p50 / floor_ms
    target = TARGETS[(case, "compute_floor_ratio")]
    print(f"{case}: {flops / 1e12:.1f} TFLOP a request, floor {floor_ms:.2f} ms on the {gpu}; HTTP p50 "
          f"{http_p50:.2f} ms = {ratio:.2f}x the floor (target <= {target.value:g}x)")  # fmt: skip
    return [
        context.record(case, "compute_floor_ms", floor_ms, "ms"),
        context.record(case, "compute_floor_ratio", ratio, "x", target.value),
        context.record(
            case, "compute_floor_ratio_target_met", float(target.met(ratio)), "bool", target.value
        ),
    ]


def request_flops(config, num_pairs: int, pair_tokens: int) -> float:
    """A cross-encoder's FLOPs for `num_pairs` pairs of `pair_tokens`: each layer's projections (2 x its
    weights a token) and attention (QK^T and PV: 4 x tokens x hidden a token)."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    per_token = layers * (
        2 * (4 * hidden * hidden + 2 * hidden * config.intermediate_size) + 4 * pair_tokens * hidden
    )
    return float(per_token * num_pairs * pair_tokens)
