"""The bulk job's pipeline on the bundled model's tokenizer with a stand-in engine: shards are written in
input order whatever order the engine finishes chunks in, the engine's queue is never overrun, and a
model failure midway stops the job with its finished shards kept for a rerun (exit status 1)."""

import asyncio
import gzip
import json
import logging
import os
import random
import threading
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from api.bulk import cli, job, job_model, progress
from api.bulk.config import JobConfig
from api.bulk.output import MANIFEST, read_output, shard_file
from api.cli import build_parsers
from api.config import EngineFlags
from engine.checkpoint.source import ModelSource
from engine.errors import EngineError
from engine.outputs import ALL_ROWS
from tests.conftest import embedder_output

NUM_ROWS = 5000
CPU = EngineFlags("cpu")
CPU_FP32 = EngineFlags("cpu", "float32")


class StandInEngine:
    """Answers each text's row as [its first content token id, 0, ...] after a random delay, so that
    chunks finish out of order; fails any call with the token id `fail_on` in it."""

    output = embedder_output()

    def __init__(self, fail_on: int | None = None):
        self.queued = self.most_queued = 0
        self.fail_on = fail_on
        self.rng = random.Random(0)

    async def run(self, sequences, token_type_ids=None, rows=ALL_ROWS):
        if any(self.fail_on in ids for ids in sequences):
            raise EngineError("model step failed: RuntimeError")
        tokens = sum(map(len, sequences))
        self.queued += tokens
        self.most_queued = max(self.most_queued, self.queued)
        await asyncio.sleep(self.rng.random() / 100)
        self.queued -= tokens
        rows = np.zeros((len(sequences), 384), dtype=np.float32)
        rows[:, 0] = [ids[1] for ids in sequences]
        return rows

    def stop(self):
        pass


FAILING_FROM = 3500  # rows from here on say "late": the failing engine's cue (shard 5 of 700-row shards)


@pytest.fixture
def corpus(tmp_path):
    texts = [f"text {i}" if i < FAILING_FROM else f"late text {i}" for i in range(NUM_ROWS)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    return tmp_path / "in.parquet"


def run_with(monkeypatch, engine, config):
    monkeypatch.setattr(job_model, "build_engine", lambda spec, engine_config: engine)
    return asyncio.run(job.run_job(config))


def test_shards_are_written_in_input_order_and_the_queue_never_overruns(corpus, tmp_path, monkeypatch):
    config = JobConfig(
        str(corpus), str(tmp_path / "out"), shard_rows=700, engine=EngineFlags("cpu", max_queue_tokens=8192)
    )
    engine = StandInEngine()
    monkeypatch.setattr(job_model, "CHUNK_TEXTS", 100)  # 50 chunks: many in flight at once
    monkeypatch.setattr(job, "ROW_GROUP_ROWS", 300)  # a shard written as its rows come back
    result = run_with(monkeypatch, engine, config)
    assert result.rows == NUM_ROWS and engine.most_queued <= 8192
    assert pq.ParquetFile(tmp_path / "out" / shard_file(0)).num_row_groups == 3  # 300 + 300 + 100 rows
    table = read_output(str(tmp_path / "out"))
    assert table.column("id").to_pylist() == list(range(NUM_ROWS))
    first_tokens = np.array(table.column("embedding").to_pylist(), dtype=np.float32)[:, 0]
    encoder = job_model.JobModel.load(config).tokenization.encoder()
    texts = pq.read_table(corpus).column("text").to_pylist()
    expected = [ids[1] for ids in encoder.encode(texts, None, True)]
    assert first_tokens.tolist() == expected  # every row is its own text's


def test_a_model_failure_midway_keeps_the_finished_shards_and_exits_1(corpus, tmp_path, monkeypatch, capsys):
    output = tmp_path / "out"
    monkeypatch.setattr(job_model, "CHUNK_TEXTS", 100)
    late = (
        job_model.JobModel.load(JobConfig(str(corpus), str(output), engine=CPU))
        .tokenization.encoder()
        .content_ids(["late"])[0][0]
    )
    monkeypatch.setattr(job_model, "build_engine", lambda spec, engine_config: StandInEngine(fail_on=late))
    parser, _, _ = build_parsers()
    args = parser.parse_args(
        ["embed", str(corpus), "--output", str(output), "--shard-rows", "700", "--device", "cpu"]
    )
    assert cli.run_embed(args) == 1
    assert "model step failed" in capsys.readouterr().err
    manifest = json.loads((output / MANIFEST).read_text())
    assert not manifest["complete"] and sorted(map(int, manifest["shards"])) == [0, 1, 2, 3, 4]
    # the rerun, with a working model, takes them up and completes
    rerun = JobConfig(str(corpus), str(output), shard_rows=700, engine=CPU)
    assert run_with(monkeypatch, StandInEngine(), rerun).skipped_rows == FAILING_FROM
    assert read_output(str(output)).column("id").to_pylist() == list(range(NUM_ROWS))


def test_progress_moves_a_chunk_at_a_time(corpus, tmp_path, monkeypatch):
    """One 5,000-row shard in chunks of 100 texts: the progress is told of each chunk as it comes back,
    not of the shard once it ends."""
    calls = []
    embedded = job.JobProgress.embedded

    def record(self, rows, tokens):
        calls.append(rows)
        embedded(self, rows, tokens)

    monkeypatch.setattr(job.JobProgress, "embedded", record)
    monkeypatch.setattr(job_model, "CHUNK_TEXTS", 100)
    config = JobConfig(str(corpus), str(tmp_path / "out"), shard_rows=NUM_ROWS, engine=CPU)
    result = run_with(monkeypatch, StandInEngine(), config)
    assert calls == [100] * 50 and result.rows == NUM_ROWS


def write_input(corpus, folder, name):
    """The corpus as `name` (its suffix the format; "pipe": CSV through a FIFO) -> (path, format given)."""
    table, path = pq.read_table(corpus), folder / name
    texts = table.column("text").to_pylist()
    if name.endswith(".parquet"):
        pq.write_table(table, path)
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    else:
        csv = ("text\n" + "".join(f"{text}\n" for text in texts)).encode()
        if name != "pipe":
            path.write_bytes(gzip.compress(csv) if name.endswith(".gz") else csv)
            return path, None
        os.mkfifo(path)
        threading.Thread(target=lambda: path.write_bytes(csv), daemon=True).start()
        return path, "csv"
    return path, None


@pytest.mark.parametrize("name", ["in.parquet", "in.jsonl", "in.csv", "in.csv.gz", "pipe"])
def test_every_input_shows_a_total_rows_per_s_and_an_eta_but_a_stream_says_it_has_none(
    corpus, tmp_path, monkeypatch, caplog, name
):
    """A file's total is counted beside the job (its engine here waits for the count, so that the first
    line has it); a stream's is known only once read to its end: until then its lines say so."""
    counts = []
    counted = job.JobProgress.counted

    def record(self, total_rows):
        counts.append(total_rows)
        counted(self, total_rows)

    class AfterTheCount(StandInEngine):
        async def run(self, sequences, token_type_ids=None, rows=ALL_ROWS):
            while name != "pipe" and not counts:
                await asyncio.sleep(0.001)
            return await super().run(sequences, token_type_ids, rows)

    monkeypatch.setattr(job.JobProgress, "counted", record)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)  # a line a chunk
    monkeypatch.setattr(job_model, "CHUNK_TEXTS", 100)
    path, given_format = write_input(corpus, tmp_path, name)
    output = str(tmp_path / "out")
    config = JobConfig(str(path), output, input_format=given_format, shard_rows=700, engine=CPU)
    with caplog.at_level(logging.INFO, logger="api.bulk.job"):
        assert run_with(monkeypatch, AfterTheCount(), config).rows == NUM_ROWS
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("embedded")]
    assert all("rows/s, " in line and "tokens/s" in line for line in lines)
    if name == "pipe":
        assert lines[0].startswith("embedded 100 rows (a stream: no total, no ETA), ")
        assert not any("left" in line for line in lines if "a stream" in line)
    else:
        assert lines[0].startswith("embedded 100 of 5,000 rows, ") and lines[0].endswith(" left")
    assert NUM_ROWS in counts  # the count's, or the end of the input's
    assert lines[-1].startswith("embedded 5,000 of 5,000 rows, ") and "left" not in lines[-1]


def test_a_bge_m3_job_writes_its_dense_vectors(minilm_path, tmp_path):
    """bge-m3 gives a row a token (its ColBERT vectors and lexical weights beside the dense one): a bulk
    job writes a vector a text, FlagEmbedding's dense vector."""
    from benchmarks.token_checkpoints import flag_m3_embedder, m3_checkpoint

    folder = m3_checkpoint(minilm_path, tmp_path / "m3")
    texts = [f"text {index} about cats and trains" for index in range(40)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    config = JobConfig(
        str(tmp_path / "in.parquet"), str(tmp_path / "out"), ModelSource(str(folder)), engine=CPU_FP32
    )
    result = asyncio.run(job.run_job(config))
    assert result.rows == len(texts)
    vectors = np.array(read_output(str(tmp_path / "out")).column("embedding").to_pylist(), dtype=np.float32)
    expected = flag_m3_embedder(folder).encode(texts, return_dense=True, batch_size=8)["dense_vecs"]
    np.testing.assert_allclose(vectors, expected, atol=1e-5)


@pytest.mark.parametrize("kind", ["siglip", "qwen3_vl"])
def test_an_image_models_job_lays_texts_out_as_the_server_does(tmp_path, kind):
    """An image model's texts in a bulk job: SigLIP's padded to its window, a vision-language embedder's in
    its chat layout with its query prompt as the system turn; the rows the server gives the same texts."""
    from litestar.testing import TestClient

    from api.app import create_app
    from api.config import ServerConfig
    from benchmarks.image_checkpoints import dual_encoder_checkpoint, vision_language_checkpoint

    if kind == "siglip":
        folder, _ = dual_encoder_checkpoint(tmp_path / kind, kind)
    else:
        folder, _ = vision_language_checkpoint(tmp_path / kind, kind=kind)
        prompts = {"prompts": {"query": "Find the picture of the animal.", "document": ""}}
        (folder / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    texts = [f"a photo of a cat number {index}" for index in range(12)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    config = JobConfig(
        str(tmp_path / "in.parquet"), str(tmp_path / "out"), ModelSource(str(folder)), engine=CPU_FP32,
        input_type="query",
    )  # fmt: skip
    assert asyncio.run(job.run_job(config)).rows == len(texts)
    written = np.array(read_output(str(tmp_path / "out")).column("embedding").to_pylist(), dtype=np.float32)
    server = ServerConfig(models=(str(folder),), engine=CPU_FP32)
    with TestClient(create_app(server)) as client:
        response = client.post("/v1/embeddings", json={"input": texts, "input_type": "query"})
    assert response.status_code == 200, response.text
    expected = np.array([item["embedding"] for item in response.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(written, expected, atol=1e-5, rtol=0)


def test_a_splade_job_writes_each_texts_sparse_vector(minilm_path, tmp_path):
    """A SPLADE model's rows are its vocabulary's weights: the job writes each text's non-zero ones,
    {indices, values} by token id, as sentence-transformers' SparseEncoder gives them (within 1e-5)."""
    from sentence_transformers import SparseEncoder

    from benchmarks.token_checkpoints import splade_checkpoint

    folder = splade_checkpoint(minilm_path, tmp_path / "splade")
    texts = [f"text {index} about cats and trains" for index in range(30)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    config = JobConfig(
        str(tmp_path / "in.parquet"), str(tmp_path / "out"), ModelSource(str(folder)), engine=CPU_FP32
    )
    assert asyncio.run(job.run_job(config)).rows == len(texts)
    written = read_output(str(tmp_path / "out")).column("embedding").to_pylist()
    reference = SparseEncoder(str(folder), device="cpu")
    expected = reference.encode(texts, convert_to_tensor=True).to_dense().numpy()
    assert len(written) == len(texts)
    for vector, weights in zip(written, expected):
        assert vector["indices"] == np.flatnonzero(weights).tolist()
        np.testing.assert_allclose(vector["values"], weights[weights != 0], atol=1e-5, rtol=1e-5)
    with pytest.raises(job_model.JobError, match="sparse"):
        job_model.JobModel.load(replace(config, dimensions=8))


@pytest.mark.parametrize("input_type", [None, "query"])
def test_a_colbert_job_writes_each_texts_token_vectors(minilm_path, tmp_path, input_type):
    """A ColBERT model's texts laid out as its documents (or, with --input-type query, its queries), in a
    tokenizer process: each row's token vectors, those colbert-ai's docFromText keeps (queryFromText's),
    within 1e-5."""
    import torch

    from benchmarks.token_checkpoints import colbert_ai_checkpoint, colbert_checkpoints

    colbert_ai, pylate = colbert_checkpoints(minilm_path, tmp_path / "colbert")
    texts = ["Cats eat fish, mostly.", "trains run on rails!", "Dogs; cats! and fish?", "word " * 40]
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    config = JobConfig(
        str(tmp_path / "in.parquet"), str(tmp_path / "out"), ModelSource(str(pylate)), engine=CPU_FP32,
        input_type=input_type, tokenizer_processes=1,
    )  # fmt: skip
    assert asyncio.run(job.run_job(config)).rows == len(texts)
    written = read_output(str(tmp_path / "out")).column("embedding").to_pylist()
    checkpoint = colbert_ai_checkpoint(colbert_ai)
    with torch.inference_mode():
        if input_type == "query":
            expected = [vectors.numpy() for vectors in checkpoint.queryFromText(texts)]
        else:
            expected = [vectors.numpy() for vectors in checkpoint.docFromText(texts, keep_dims=False)]
    for vectors, reference in zip(written, expected):
        np.testing.assert_allclose(np.array(vectors, dtype=np.float32), reference, atol=1e-5)
