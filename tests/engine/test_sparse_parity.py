"""Sparse and multi-output heads against their reference packages, fp32 on the CPU, tiny random
checkpoints: SPLADE against sentence-transformers' SparseEncoder (max and sum pooling; vocabulary weights
within 1e-5), bge-m3 against FlagEmbedding's BGEM3FlagModel (dense and ColBERT vectors within 1e-5,
lexical weights: the same token ids, weights within 1e-5); and bge-m3's dense requests, which take only
each text's first row off the device."""

import asyncio

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from benchmarks.token_checkpoints import flag_m3_embedder, m3_checkpoint, splade_checkpoint
from engine.attention import select_backend
from engine.batch import pack
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.models import sparse as sparse_module
from engine.outputs import EMBED, RowRequest
from engine.runner import ModelRunner
from engine.weights import load_model
from scoring.m3_rows import m3_outputs, unused_token_ids

TOLERANCE = 1e-5
TEXTS = ["what do cats eat?", "Cats eat fish, mostly.", "a", "word " * 60, "Ünïcödé façade; 東京 🙂"]


def encode(spec, texts):
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return [encoding.ids for encoding in tokenizer.encode_batch(texts)]


@pytest.mark.parametrize(
    ("family", "pooling", "activation"),
    [
        ("bert", "max", "relu"),
        ("bert", "sum", "relu"),
        ("distilbert", "max", "log1p_relu"),  # OpenSearch's sparse encoders
        ("roberta", "max", "relu"),
    ],
)
def test_splade_weights_match_sentence_transformers(
    minilm_path, tmp_path, monkeypatch, family, pooling, activation
):
    from sentence_transformers import SparseEncoder

    folder = splade_checkpoint(
        minilm_path, tmp_path / "splade", pooling=pooling, activation=activation, family=family
    )
    spec = resolve_model(str(folder))
    assert spec.task == "sparse_embed" and spec.output_dim == spec.vocab_size
    # small chunks, so that a sequence's tokens span several of them
    monkeypatch.setattr(sparse_module, "LOGIT_CHUNK_TOKENS", 7)
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    # the vocabulary projection padded for aligned GEMMs (30,522 rows: 30,528), the rows the vocabulary's
    assert model.mlm.decoder.out_features % sparse_module.VOCAB_ALIGNMENT == 0
    assert model.mlm.decoder.out_features > spec.vocab_size
    with torch.inference_mode():
        rows = model(pack(encode(spec, TEXTS))).numpy()
    reference = SparseEncoder(str(folder), device="cpu")
    expected = reference.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    assert rows.shape == expected.shape
    assert (expected > 0).sum(axis=1).min() > 0
    np.testing.assert_allclose(rows, expected, atol=TOLERANCE, rtol=TOLERANCE)


def test_splade_misses_the_reference_without_its_mlm_transform(minilm_path, tmp_path):
    """The parity above can fail: a head without its LayerNorm gives other weights."""
    from sentence_transformers import SparseEncoder

    folder = splade_checkpoint(minilm_path, tmp_path / "splade")
    spec = resolve_model(str(folder))
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    model.mlm.norm = torch.nn.Identity()
    with torch.inference_mode():
        rows = model(pack(encode(spec, TEXTS[:2]))).numpy()
    expected = SparseEncoder(str(folder), device="cpu").encode(TEXTS[:2], convert_to_tensor=True).to_dense()
    assert np.abs(rows - expected.numpy()).max() > 100 * TOLERANCE


def test_bge_m3_outputs_match_flag_embedding(minilm_path, tmp_path):
    folder = m3_checkpoint(minilm_path, tmp_path / "m3")
    spec = resolve_model(str(folder))
    assert spec.m3 and spec.task == "embed" and spec.pooling == "cls" and spec.normalize
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    assert model.output.token_rows
    token_ids = encode(spec, TEXTS)
    with torch.inference_mode():
        rows = model(pack(token_ids)).numpy()
    unused = unused_token_ids(Tokenizer.from_file(str(spec.tokenizer_path)), spec.path)
    assert len(unused) == 3  # [CLS], [PAD], [UNK]: the MiniLM tokenizer has no end token of that name
    outputs = m3_outputs(rows, token_ids, unused, model.output)

    expected = flag_m3_embedder(folder).encode(
        TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True, batch_size=2
    )
    assert sum(len(output.lexical) for output in outputs) >= 8  # weights to compare
    for index, output in enumerate(outputs):
        np.testing.assert_allclose(output.dense, expected["dense_vecs"][index], atol=TOLERANCE)
        np.testing.assert_allclose(output.colbert, expected["colbert_vecs"][index], atol=TOLERANCE)
        lexical = {int(token): float(weight) for token, weight in expected["lexical_weights"][index].items()}
        assert sorted(output.lexical) == sorted(lexical)
        for token, weight in lexical.items():
            assert abs(output.lexical[token] - weight) <= TOLERANCE


def test_bge_m3_dense_requests_take_only_their_first_rows_off_the_device(minilm_path, tmp_path):
    """A request for bge-m3's embeddings (its head's declared rows for the task: each text's first row,
    less its lexical weight) gets its dense vector a text: each the first row of the text's whole output,
    in a batch beside a request for every token's rows, and through two replica processes in chunks as in
    process."""
    from engine.checkpoint.source import ModelSource
    from engine.replicas.replica_set import ReplicaSet

    folder = m3_checkpoint(minilm_path, tmp_path / "m3")
    spec = resolve_model(str(folder))
    token_ids = encode(spec, TEXTS)
    lengths = [len(ids) for ids in token_ids]
    firsts = np.cumsum([0, *lengths[:-1]])
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    with torch.inference_mode():
        whole = model(pack(token_ids)).numpy()
    width = whole.shape[1]
    mixed = ModelRunner(model, torch.device("cpu")).step(
        pack(token_ids * 2, first_rows=[True] * len(TEXTS) + [False] * len(TEXTS))
    )
    mixed = mixed.result()
    assert mixed.shape == (len(TEXTS) + sum(lengths), width)
    np.testing.assert_allclose(mixed[: len(TEXTS)], whole[firsts], atol=TOLERANCE)
    np.testing.assert_allclose(mixed[len(TEXTS) :], whole, atol=TOLERANCE)

    config = EngineConfig(max_batch_tokens=128, max_queue_tokens=10**5, dtype="float32")
    engine = build_engine(spec, config)
    replica_set = ReplicaSet(ModelSource(str(folder)), 2, config)
    replica_set.start()

    dense = RowRequest.for_task(engine.output, EMBED)
    assert dense == RowRequest(first_rows=True, columns=(0, width - 1))

    async def both():
        in_process = engine.enqueue(token_ids * 4, rows=dense)
        beside = engine.enqueue(token_ids)  # every token's rows, in the same batches
        replicated = replica_set.pool.enqueue(token_ids * 4, rows=dense)
        return (await in_process).rows, (await beside).rows, (await replicated).rows

    try:
        in_process, beside, replicated = asyncio.run(asyncio.wait_for(both(), 120))
    finally:
        engine.stop()
        replica_set.stop()
    assert in_process.shape == replicated.shape == (4 * len(TEXTS), width - 1)
    np.testing.assert_allclose(in_process, np.tile(whole[firsts, :-1], (4, 1)), atol=TOLERANCE)
    np.testing.assert_allclose(replicated, in_process, atol=TOLERANCE)
    np.testing.assert_allclose(beside, whole, atol=TOLERANCE)
