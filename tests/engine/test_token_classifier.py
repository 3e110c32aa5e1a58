"""A *ForTokenClassification checkpoint (engine/models/token_classifier.py, the head added as one file and
one row of HEAD_DETECTORS) against transformers' own class, on tiny random checkpoints of three layouts
(BERT's `classifier`, ModernBERT's prediction head then `classifier`, a decoder's `score`): every token's
logits in fp32 within 1e-5, in process, through two replica processes, through HTTP /pooling with task
token_classify, and in a `posy embed` job; on CUDA in bf16 through captured and replayed CUDA graphs."""

import asyncio
import base64
import json

import numpy as np
import pytest
import torch
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from benchmarks.token_checkpoints import (
    TINY_QWEN3,
    byte_level_tokenizer,
    copy_tokenizer,
    tiny_bert_config,
)
from engine.attention import select_backend
from engine.batch import pack
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.weights import load_model
from tests.engine.graph_runs import run_three_times

TOLERANCE = 1e-5  # max abs logit error, fp32
TEXTS = ["John lives in Paris.", "a", "Acme Corp. hired Ada Lovelace in London last May!", "word " * 40]
LABELS = {"bert": 5, "modernbert": 4, "qwen3": 3}


def randomize(model: torch.nn.Module, seed: int, std: float = 0.2) -> torch.nn.Module:
    """Every parameter noise, norm scales around 1 (so that parity can fail on any of them)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * std
            is_norm_scale = "norm" in name.lower() and name.endswith("weight")
            parameter.copy_(1 + noise if is_norm_scale else noise)
    return model.eval()


def token_classifier(minilm, folder, layout: str, std: float = 0.2):
    """A tiny random *ForTokenClassification of `layout`, saved as transformers saves it."""
    from transformers import AutoModelForTokenClassification, ModernBertConfig, Qwen3Config

    folder.mkdir(parents=True, exist_ok=True)
    if layout == "qwen3":
        tokenizer = byte_level_tokenizer()
        tokenizer.save(str(folder / "tokenizer.json"))
        config = Qwen3Config(vocab_size=tokenizer.get_vocab_size(), max_position_embeddings=256, **TINY_QWEN3)
    elif layout == "modernbert":
        copy_tokenizer(minilm, folder)
        vocab_size = json.loads((minilm / "config.json").read_text())["vocab_size"]
        config = ModernBertConfig(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, global_attn_every_n_layers=2, local_attention=8,
            max_position_embeddings=128, pad_token_id=0, cls_token_id=101, sep_token_id=102,
        )  # fmt: skip
    else:
        copy_tokenizer(minilm, folder)
        config = tiny_bert_config(minilm)
    config.architectures = [f"{type(config).__name__.removesuffix('Config')}ForTokenClassification"]
    config.num_labels = LABELS[layout]
    torch.manual_seed(0)
    model = randomize(AutoModelForTokenClassification.from_config(config), seed=len(layout), std=std)
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module", params=list(LABELS))
def checkpoint(request, minilm_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"token-classifier-{request.param}")
    return token_classifier(minilm_path, folder, request.param)


def token_ids(spec, texts):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_padding()
    return [encoding.ids for encoding in tokenizer.encode_batch(texts)]


def reference_logits(model, sequences) -> np.ndarray:
    """transformers' logits, each sequence alone (no padding), concatenated: [tokens, labels]."""
    with torch.inference_mode():
        return torch.cat([model(input_ids=torch.tensor([ids])).logits[0] for ids in sequences]).numpy()


def test_every_tokens_logits_match_transformers(checkpoint):
    folder, reference = checkpoint
    spec = resolve_model(str(folder))
    assert (spec.task, spec.output_dim) == ("token_classify", reference.config.num_labels)
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    assert model.output.token_rows and model.output.tasks == ("token_classify",)
    sequences = token_ids(spec, TEXTS)
    with torch.inference_mode():
        ours = model(pack(sequences)).numpy()
    expected = reference_logits(reference, sequences)
    assert ours.dtype == np.float32 and ours.shape == expected.shape == (
        sum(map(len, sequences)),
        spec.num_labels,
    )
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)


def test_in_process_and_through_two_replicas(minilm_path, tmp_path):
    """The engine in process and two replica processes (chunks of at most 64 tokens) give the same rows as
    the model, every sequence's token rows in input order."""
    from engine.checkpoint.source import ModelSource
    from engine.replicas.replica_set import ReplicaSet

    folder, reference = token_classifier(minilm_path, tmp_path / "bert", "bert")
    spec = resolve_model(str(folder))
    sequences = token_ids(spec, TEXTS) * 3
    expected = reference_logits(reference, sequences)
    config = EngineConfig(device="cpu", dtype="float32", max_batch_tokens=64, max_queue_tokens=10**5)
    engine = build_engine(spec, config)
    replica_set = ReplicaSet(ModelSource(str(folder)), 2, config)
    replica_set.start()

    async def both():
        return (await engine.enqueue(sequences)).rows, (await replica_set.pool.enqueue(sequences)).rows

    try:
        in_process, replicated = asyncio.run(asyncio.wait_for(both(), 120))
    finally:
        engine.stop()
        replica_set.stop()
    np.testing.assert_allclose(in_process, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(replicated, expected, atol=TOLERANCE, rtol=0)


def test_pooling_serves_a_tokens_logits_and_names_the_task(minilm_path, tmp_path):
    folder, reference = token_classifier(minilm_path, tmp_path / "bert", "bert")
    spec = resolve_model(str(folder))
    sequences = token_ids(spec, TEXTS)
    expected = np.split(
        reference_logits(reference, sequences), np.cumsum([len(ids) for ids in sequences])[:-1]
    )
    config = ServerConfig(models=(str(folder),), served_model_names=(("ner",),))
    with TestClient(create_app(config)) as client:
        [model] = client.get("/v1/models").json()["data"]
        assert model["tasks"] == ["token_classify"]
        # the model's own task without asking, and asked by name, as lists and as base64
        for body in ({"input": TEXTS}, {"input": TEXTS, "task": "token_classify", "model": "ner"}):
            response = client.post("/pooling", json=body)
            assert response.status_code == 200, response.text
            payload = response.json()
            assert payload["usage"]["prompt_tokens"] == sum(map(len, sequences))
            for item, logits in zip(payload["data"], expected, strict=True):
                np.testing.assert_allclose(np.array(item["data"]), logits, atol=TOLERANCE, rtol=0)
        response = client.post("/pooling", json={"input": TEXTS[:1], "encoding_format": "base64"})
        matrix = np.frombuffer(base64.b64decode(response.json()["data"][0]["data"]), "<f4")
        np.testing.assert_allclose(matrix.reshape(expected[0].shape), expected[0], atol=TOLERANCE, rtol=0)
        # what it does not serve: a 400 naming what it does, and it serves on
        response = client.post("/v1/embeddings", json={"input": "a"})
        assert response.status_code == 400
        assert "token_classify (/pooling with task token_classify)" in response.json()["error"]["message"]
        for task in ("rerank", "token_embed", "all", "nonsense"):
            response = client.post("/pooling", json={"input": "a", "task": task})
            assert response.status_code == 400, (task, response.text)
        assert client.post("/pooling", json={"input": "a"}).status_code == 200


def test_posy_embed_writes_each_texts_token_logits(minilm_path, tmp_path):
    """A bulk job of a token classifier writes each text's rows as its head declares them: a list of
    logits a token, in input order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from api.bulk.config import JobConfig
    from api.bulk.job import run_job
    from api.bulk.output import read_output
    from api.config import EngineFlags
    from engine.checkpoint.source import ModelSource

    folder, reference = token_classifier(minilm_path, tmp_path / "bert", "bert")
    sequences = token_ids(resolve_model(str(folder)), TEXTS * 5)
    pq.write_table(pa.table({"text": TEXTS * 5}), tmp_path / "in.parquet")
    config = JobConfig(
        str(tmp_path / "in.parquet"), str(tmp_path / "out"), ModelSource(str(folder)), shard_rows=8,
        engine=EngineFlags("cpu", "float32"),
    )  # fmt: skip
    assert asyncio.run(run_job(config)).rows == len(sequences)
    written = read_output(str(tmp_path / "out")).column("embedding").to_pylist()
    for rows, ids in zip(written, sequences, strict=True):
        np.testing.assert_allclose(np.array(rows), reference_logits(reference, [ids]), atol=TOLERANCE, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", list(LABELS))
def test_cuda_graphs_give_the_fp32_logits_in_bf16(minilm_path, tmp_path, layout):
    """bf16 on CUDA, each request run eagerly, then captured, then replayed: every token's logits within
    2% of the largest of the fp32 CPU model's (the tiny checkpoints' weights at a trained model's scale)."""
    folder, reference = token_classifier(minilm_path, tmp_path / layout, layout, std=0.08)
    spec = resolve_model(str(folder))
    requests = [token_ids(spec, TEXTS), token_ids(spec, TEXTS[:1]), token_ids(spec, TEXTS[2:] * 5)]
    results, graphs = run_three_times(spec, EngineConfig(device="cuda", dtype="bfloat16"), requests)
    assert graphs is not None and graphs.graphs, "no graph was captured"
    for request, runs in zip(requests, results):
        expected = reference_logits(reference, request)
        for rows in runs:
            assert rows.shape == expected.shape
            assert np.abs(rows - expected).max() <= 2e-2 * np.abs(expected).max()
