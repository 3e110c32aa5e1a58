"""Suite 2, low-latency scoring: one query with 5, 25 and 50 documents, each (query, document) pair 512
tokens after templating, through the rerank path (templates, chunking, one engine request, scores on the
host) with a BERT-base-shaped cross-encoder and a Qwen3-Reranker-0.6B-shaped judge, against HF
transformers on the same weights and the same token ids. The judge's cases run with and without shared
prefixes, and its 50-document ones also over HTTP: `/v2/rerank` of a live `posy serve` in its default
layout, one client, with --shared-prefixes on and off. `--smoke`: tiny shapes on the CPU, seconds (no
HTTP)."""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.baseline import Baseline
from benchmarks.checkpoints import save_bert, save_qwen3, words
from benchmarks.records import RunContext, SuiteOutcome, engine_backend
from benchmarks.timing import timed

MODEL = "bert-base cross-encoder / qwen3-reranker-0.6b shapes (random weights)"
NUM_DOCUMENTS = (5, 25, 50)
PAIR_TOKENS = 512
SMOKE_PAIR_TOKENS = 128  # the judge's prompt alone takes about 80
QUERY_WORDS = 12
# the shared-prefix case: one query of about 40 tokens, 50 passages of 150 (smoke: 8 and 20)
RAG_DOCUMENTS, RAG_QUERY_TOKENS, RAG_PASSAGE_TOKENS = 50, 40, 150
SMOKE_RAG = (8, 20)
MAX_SCORE_ERROR = 1e-2  # posy in bf16 against the baseline in fp32
HTTP_REPEATS = 20


def rerank_model(engine, folder: Path, kind: str, window: int):
    """The RerankModel the server would build for this checkpoint (api/models.py), on this engine."""
    from tokenizers import Tokenizer

    from scoring.rerank import RerankModel
    from scoring.templates import QWEN3_JUDGE, PairTemplate, SingleTemplate, TextPrompts

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    judge = kind == "judge"
    pair = QWEN3_JUDGE.pair_template(tokenizer) if judge else PairTemplate.from_tokenizer(tokenizer)
    return tokenizer, RerankModel(
        engine=engine, window=window, single=SingleTemplate.from_tokenizer(tokenizer), pair=pair,
        cross_encoder=True, prompts=QWEN3_JUDGE if judge else TextPrompts(),
    )  # fmt: skip


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig
    from scoring.rerank import RerankOptions, rerank_scores

    smoke = getattr(options, "smoke", False)
    device = "cpu" if smoke else "cuda"
    dtype, dtype_name = (torch.float32, "float32") if smoke else (torch.bfloat16, "bfloat16")
    repeats = 5 if smoke else 20 * options.rounds
    pair_tokens = SMOKE_PAIR_TOKENS if smoke else PAIR_TOKENS
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    loop = asyncio.new_event_loop()
    rng = random.Random(2)
    records, failures = [], []
    http_cases: list[tuple[str, str, list[str]]] = []  # the judge's 50-document cases, for http_rerank

    def measure(case, model, tokenizer, baseline, query_ids, documents, context, length) -> float | None:
        """Times one case; its p50 in ms (None where the parity gate failed)."""
        texts = [model.prompts.document_text(document) for document in documents]
        docs_ids = [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
        pairs = [model.pair.apply(query_ids, ids) for ids in docs_ids]
        assert {len(ids) for ids, _ in pairs} == {length}, "pairs of the wrong length"
        ids, types = [ids for ids, _ in pairs], [types for _, types in pairs]

        def score() -> np.ndarray:
            return loop.run_until_complete(rerank_scores(model, query_ids, docs_ids, RerankOptions()))

        for _ in range(3):  # eager, capture, replay
            scores = score()
        # the parity gate first: wrong scores are not timed
        error = float(np.abs(scores - baseline.to(torch.float32).score_ids(ids, types)).max())
        baseline.to(dtype)
        records.append(context.record(case, "max_score_error_vs_fp32", error, "probability"))
        if error > MAX_SCORE_ERROR:
            print(f"{case}: max score error {error:.5f}: not timed")
            failures.append(f"{case}: score error {error:.4f} > {MAX_SCORE_ERROR}")
            return None
        posy = timed(score, repeats, device)
        timed(lambda: baseline.score_ids(ids, types), 2, device)
        hf = timed(lambda: baseline.score_ids(ids, types), max(3, repeats // 4), device)
        posy_p50, hf_p50 = 1000 * float(np.median(posy)), 1000 * float(np.median(hf))
        records.append(context.record(case, "latency_p50_ms", posy_p50, "ms", hf_p50))
        records.append(context.record(case, "latency_p99_ms", 1000 * float(np.percentile(posy, 99)), "ms"))
        print(f"{case}: posy p50 {posy_p50:.2f} ms, HF {hf_p50:.2f} ms, max score error {error:.5f}")
        return posy_p50

    models = [
        ("cross-encoder", save_bert, "smoke" if smoke else "bert-base", "bert-base-cross-encoder"),
        ("judge", save_qwen3, "smoke" if smoke else "qwen3-0.6b", "qwen3-reranker-0.6b"),
    ]
    for kind, save, shape, name in models:
        checkpoint = save(Path(tempfile.mkdtemp()), shape, kind)
        spec = resolve_model(str(checkpoint.folder))
        config = EngineConfig(
            device=device, dtype=dtype_name, attention_backend=options.backend, max_batch_tokens=32768,
            max_queue_tokens=64 * 32768, cuda_graphs="off" if smoke else "lazy",
        )  # fmt: skip
        engine = build_engine(spec, config)
        context = RunContext(suite=options.suite, model=MODEL, gpu=gpu, backend=engine_backend(engine))
        tokenizer, model = rerank_model(engine, checkpoint.folder, kind, spec.max_seq_length)
        baseline = Baseline(checkpoint, device, dtype)
        query_words = words(QUERY_WORDS, rng)
        query_ids = tokenizer.encode(model.prompts.query_text(query_words), add_special_tokens=False).ids
        document_tokens = pair_tokens - len(query_ids) - model.pair.num_special_tokens
        # a causal judge runs each pair's template head and query once (shared prefixes): its cases also
        # run without, and a RAG-sized one (a 40-token query, 150-token passages) shows the gain
        default = engine.shares_prefixes
        sharing = (True, False) if engine.runs_prefixes else (default,)
        cases = [(n, document_tokens, query_words, query_ids, pair_tokens) for n in NUM_DOCUMENTS]
        if engine.runs_prefixes:
            rag_words = words(SMOKE_RAG[0] if smoke else RAG_QUERY_TOKENS, rng)
            rag_ids = tokenizer.encode(model.prompts.query_text(rag_words), add_special_tokens=False).ids
            passage = SMOKE_RAG[1] if smoke else RAG_PASSAGE_TOKENS
            rag_length = len(rag_ids) + passage + model.pair.num_special_tokens
            cases.append((RAG_DOCUMENTS, passage, rag_words, rag_ids, rag_length))
        try:
            for num_documents, document, query_text, query, length in cases:
                documents = [words(document, rng) for _ in range(num_documents)]
                case = f"{name}-{num_documents}x{length}"
                if engine.runs_prefixes and num_documents == RAG_DOCUMENTS and not smoke:
                    http_cases.append((case, query_text, documents))
                p50 = {}
                for shares in sharing:
                    engine.shares_prefixes = shares
                    label = f"{case}-shared" if shares and len(sharing) == 2 else case
                    p50[shares] = measure(
                        label, model, tokenizer, baseline, query, documents, context, length
                    )
                engine.shares_prefixes = default
                if len(p50) == 2 and None not in p50.values():
                    speedup = p50[False] / p50[True]
                    records.append(context.record(case, "shared_prefix_speedup", speedup, "x"))
                    print(f"{case}: shared prefix {speedup:.2f}x the whole pairs")
        finally:
            engine.stop()
        if http_cases:
            records.extend(http_rerank(checkpoint.folder, http_cases, options.suite, gpu))
    loop.close()
    return SuiteOutcome(records, failures)


def http_rerank(folder: Path, cases: list, suite: str, gpu: str | None) -> list:
    """p50 of `/v2/rerank` for each (case, query, documents), one request at a time from an httpx client,
    on a live `posy serve` of `folder` in its default layout, with shared prefixes on, then off."""
    import httpx

    from benchmarks.live_server import serve, served_backend, served_info
    from benchmarks.timing import timed

    p50, records = {}, []
    for sharing in ("on", "off"):
        with serve(folder, "--served-model-name", "judge", "--shared-prefixes", sharing) as url:
            backend, rule = served_backend(url), served_info(url, "shared_prefixes")
            print(f"HTTP, --shared-prefixes {sharing}: backend {backend}, shared prefixes {rule}", flush=True)
            with httpx.Client(base_url=url, timeout=120.0, trust_env=False) as client:
                for case, query, documents in cases:
                    body = {"model": "judge", "query": query, "documents": documents}

                    def post(body: dict = body, case: str = case) -> None:
                        response = client.post("/v2/rerank", json=body)
                        if response.status_code != 200:
                            raise RuntimeError(f"{case}: {response.status_code} {response.text[:200]}")

                    for _ in range(3):  # eager, capture, replay
                        post()
                    p50[case, sharing] = 1000 * float(np.median(timed(post, HTTP_REPEATS, "cpu")))
    context = RunContext(suite=suite, model=MODEL, gpu=gpu, backend=backend)
    for case, _, _ in cases:
        shared, whole = p50[case, "on"], p50[case, "off"]
        records.append(context.record(f"{case}-http-shared", "latency_p50_ms", shared, "ms"))
        records.append(context.record(f"{case}-http", "latency_p50_ms", whole, "ms"))
        records.append(context.record(f"{case}-http", "shared_prefix_speedup", whole / shared, "x"))
        print(f"{case} over HTTP: shared {shared:.2f} ms, whole pairs {whole:.2f} ms, {whole / shared:.2f}x")
    return records
