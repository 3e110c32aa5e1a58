"""The bulk suite: `posy embed` (run_job, the CLI's own path) on 1M short texts (50 tokens each) in a
Parquet file, against the engine's own tokens/s on pre-tokenized 50-token inputs at saturation (the
engine suite's case), measured in the same run on the same checkpoint: BERT-base shape, random weights,
bf16. The job's rate counts from its first shard to its last write (reading, tokenizing, embedding,
writing Parquet); model loading is left out of both sides. Gate: output rows against the engine's rows
for the same texts. `--smoke`: 2,000 texts, the tiny shape on the CPU."""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.baseline import min_cosine
from benchmarks.checkpoints import save_bert, words
from benchmarks.records import RunContext, SuiteOutcome, engine_backend

TEXT_TOKENS = 50  # special tokens included
NUM_SPECIAL_TOKENS = 2  # [CLS] ... [SEP]
NUM_DISTINCT = 65_536  # texts cycled to fill the rows: no cache anywhere makes a repeat cheaper


@dataclass(frozen=True, slots=True)
class Plan:
    shape: str
    device: str
    dtype: str
    num_rows: int
    shard_rows: int
    num_checked: int  # output rows gated against the engine's rows
    min_cosine: float


FULL = Plan("bert-base", "cuda", "bfloat16", 1_000_000, 100_000, 2048, 0.999)
SMOKE = Plan("smoke", "cpu", "float32", 2_000, 500, 256, 0.99999)


def write_input(folder: Path, plan: Plan, rng: random.Random) -> tuple[Path, list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    distinct = [words(TEXT_TOKENS - NUM_SPECIAL_TOKENS, rng) for _ in range(min(NUM_DISTINCT, plan.num_rows))]
    texts = pa.array(distinct).take(pa.array(np.arange(plan.num_rows) % len(distinct)))
    path = folder / "texts.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=100_000)
    return path, distinct


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    from api.bulk.config import JobConfig
    from api.bulk.job import run_job
    from api.bulk.output import read_output
    from api.config import EngineFlags
    from api.tokenize import TextEncoder
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.checkpoint.source import ModelSource
    from engine.config import sized_for

    plan = SMOKE if getattr(options, "smoke", False) else FULL
    folder = Path(tempfile.mkdtemp(prefix="posy-bulk-"))
    checkpoint = save_bert(folder / "model", plan.shape)
    path, distinct = write_input(folder, plan, random.Random(0))
    spec = resolve_model(str(checkpoint.folder))
    encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size)
    config = sized_for(spec.max_seq_length, plan.device, plan.dtype, options.backend)
    gpu = torch.cuda.get_device_name() if plan.device == "cuda" else None

    # the engine's own rate: pre-tokenized 50-token inputs, 64 a request, all in flight at once
    engine = build_engine(spec, config)
    context = RunContext(options.suite, f"{plan.shape}-shape (random weights)", gpu, engine_backend(engine))
    sequences = encoder.encode(distinct, None, False)
    requests = [sequences[start : start + 64] for start in range(0, min(len(sequences), 16384), 64)]
    loop = asyncio.new_event_loop()

    async def saturate() -> None:
        await asyncio.gather(*(engine.run(request) for request in requests))

    try:
        checked = sequences[: plan.num_checked]
        reference = loop.run_until_complete(engine.run(checked))
        for _ in range(2):
            loop.run_until_complete(saturate())
        samples = []
        for _ in range(options.rounds):
            started = time.perf_counter()
            loop.run_until_complete(saturate())
            samples.append(time.perf_counter() - started)
        engine_rate = sum(map(len, sequences[: 64 * len(requests)])) / statistics.median(samples)
    finally:
        engine.stop()
        loop.close()

    job = JobConfig(
        input=str(path), output=str(folder / "vectors"), source=ModelSource(str(checkpoint.folder)),
        shard_rows=plan.shard_rows, engine=EngineFlags(plan.device, plan.dtype, options.backend),
    )  # fmt: skip
    try:
        result = asyncio.run(run_job(job))
        table = read_output(job.output)
        rows = np.array(table.column("embedding").slice(0, plan.num_checked).to_pylist(), dtype=np.float32)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # 1M float32 rows of 768: 3 GB
    failures = []
    if result.rows != plan.num_rows or result.tokens != plan.num_rows * TEXT_TOKENS:
        failures.append(f"the job embedded {result.rows} rows, {result.tokens} tokens, not all the input's")
    cosine = min_cosine(rows, reference)
    if cosine < plan.min_cosine:
        failures.append(f"output rows against the engine's: min cosine {cosine:.6f} < {plan.min_cosine}")
    ratio = result.tokens_per_s / engine_rate
    case = f"embed-{plan.num_rows // 1000}k-{TEXT_TOKENS}tok"
    print(
        f"{case}: posy embed {result.tokens_per_s / 1e6:.3f}M tokens/s ({result.rows:,} rows in "
        f"{result.seconds:.1f} s), the engine alone {engine_rate / 1e6:.3f}M tokens/s: {ratio:.3f}; "
        f"min cosine {cosine:.6f} against the engine's rows"
    )
    records = [
        context.record(case, "tokens_per_s", result.tokens_per_s, "tokens/s", engine_rate),
        context.record(case, "rows_per_s", result.rows / result.seconds, "rows/s"),
        context.record(case, "min_cosine_vs_engine", cosine, "cosine"),
    ]
    return SuiteOutcome(records, failures)
