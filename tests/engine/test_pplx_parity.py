"""pplx-embed-v1 and pplx-embed-context-v1 in their published layouts (tiny random checkpoints,
compat_tests/pplx_checkpoints.py) on posy's packed Qwen3 without their remote code: the spec read from the
checkpoint (bidirectional, mean-pooled, unnormalized, its tanh quantizer, the contextual model's separator),
and the vectors against the reference computation (transformers' Qwen3Model, every attention non-causal;
a contextual document read whole, each chunk the mean of its own tokens) in fp32, max abs error within
1e-5, in process and through two engine replica processes."""

import asyncio
import json
import shutil

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from compat_tests.pplx_checkpoints import (
    SEPARATOR,
    build_pplx_embed,
    hidden_states,
    reference_chunks,
    reference_vector,
)
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.checkpoint.source import ModelSource
from engine.config import EngineConfig
from engine.errors import UnsupportedModel
from engine.outputs import RowRequest

TOLERANCE = 1e-5  # max abs difference of the float vectors, fp32
TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    "x",
    "Emperor penguins raise their chicks on the Antarctic sea ice through the long dark winter.",
]
DOCUMENTS = [
    ["Berlin is the capital of Germany.", "The city has 3.8 million inhabitants.", "It is also a state."],
    ["The Eiffel Tower was finished in 1889."],
    ["Bananas are a yellow fruit rich in potassium.", "They grow in the tropics."],
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("pplx")
    return {
        "v1": (root / "v1", build_pplx_embed(root / "v1")),
        "context": (root / "context", build_pplx_embed(root / "context", contextual=True, seed=1)),
    }


def tokenized(folder, texts):
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [tokenizer.encode(text).ids for text in texts]


def joined(folder, documents):
    """Each document as posy lays it out: its chunks tokenized apart, the separator's id between them; the
    spans where each chunk and separator starts."""
    separator = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(SEPARATOR)
    sequences, spans, chunks_of = [], [], []
    for chunks in documents:
        ids = tokenized(folder, chunks)
        sequence, starts = [], []
        for index, chunk in enumerate(ids):
            if index:
                starts.append(len(sequence))
                sequence.append(separator)
                starts.append(len(sequence))
            sequence += chunk
        sequences.append(sequence)
        spans.append(starts or None)
        chunks_of.append(ids)
    return sequences, spans, chunks_of, separator


def chunk_rows(rows, documents):
    """The rows of the chunks, those of the separators dropped (every other span)."""
    kept, row = [], 0
    for chunks in documents:
        kept.append(rows[row : row + 2 * len(chunks) - 1 : 2])
        row += 2 * len(chunks) - 1
    return np.concatenate(kept)


def test_the_spec_is_read_from_the_published_layout(checkpoints):
    for folder, _ in checkpoints.values():
        spec = resolve_model(str(folder))  # no --trust-remote-code: posy runs none of its code
        assert (spec.architecture, spec.implementation, spec.task) == ("PPLXQwen3Model", "posy", "embed")
        assert (spec.bidirectional, spec.pooling, spec.normalize) == (True, "mean", False)
        assert spec.native_quantization == "tanh" and spec.matryoshka and spec.max_seq_length == 512
        assert spec.prompts == {}
    assert resolve_model(str(checkpoints["v1"][0])).chunk_join is None
    join = resolve_model(str(checkpoints["context"][0])).chunk_join
    context_tokenizer = Tokenizer.from_file(str(checkpoints["context"][0] / "tokenizer.json"))
    assert (join.separator, join.separator_id) == (SEPARATOR, context_tokenizer.token_to_id(SEPARATOR))


def test_the_contextual_class_joins_with_its_default_separator_and_needs_it(checkpoints, tmp_path):
    folder = tmp_path / "context"
    shutil.copytree(checkpoints["context"][0], folder)
    (folder / "tokenizer_config.json").unlink()  # no sep_token: the remote class's own
    assert resolve_model(str(folder)).chunk_join.separator == SEPARATOR
    (folder / "tokenizer_config.json").write_text(json.dumps({"sep_token": "<|not-a-token|>"}))
    with pytest.raises(UnsupportedModel, match="not-a-token"):
        resolve_model(str(folder))


def test_an_unknown_module_of_its_own_code_is_refused(checkpoints, tmp_path):
    folder = tmp_path / "v1"
    shutil.copytree(checkpoints["v1"][0], folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules[-1]["type"] = "st_quantize.SomethingElse"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedModel, match="SomethingElse"):
        resolve_model(str(folder))


def engine_config():
    # two replicas split a request at 256 tokens
    return EngineConfig(device="cpu", dtype="float32", max_batch_tokens=512, max_queue_tokens=10**5)


def test_in_process_and_through_two_replicas(checkpoints):
    from engine.replicas.replica_set import ReplicaSet

    v1_folder, v1_reference = checkpoints["v1"]
    context_folder, context_reference = checkpoints["context"]
    texts = tokenized(v1_folder, TEXTS * 6)
    sequences, spans, chunks_of, separator = joined(context_folder, DOCUMENTS * 6)
    expected_v1 = np.stack([reference_vector(v1_reference, ids) for ids in texts])
    expected_chunks = np.concatenate(
        [reference_chunks(context_reference, ids, separator) for ids in chunks_of]
    )
    config = engine_config()
    engines = [build_engine(resolve_model(str(folder)), config) for folder in (v1_folder, context_folder)]
    replica_sets = [ReplicaSet(ModelSource(str(folder)), 2, config) for folder in (v1_folder, context_folder)]
    for replica_set in replica_sets:
        replica_set.spawn()  # both at once
    for replica_set in replica_sets:
        replica_set.wait_ready()

    async def run(v1, context):
        pooled = RowRequest(spans=spans)
        return await v1.run(texts), await context.run(sequences, rows=pooled)

    async def both():
        return await run(*engines), await run(*(replica_set.pool for replica_set in replica_sets))

    try:
        in_process, replicated = asyncio.run(asyncio.wait_for(both(), 120))
    finally:
        for engine in engines:
            engine.stop()
        for replica_set in replica_sets:
            replica_set.stop()
    for v1_rows, context_rows in (in_process, replicated):
        assert v1_rows.dtype == np.float32 and v1_rows.shape == (len(texts), 64)
        np.testing.assert_allclose(v1_rows, expected_v1, atol=TOLERANCE, rtol=0)
        assert len(context_rows) == sum(2 * len(chunks) - 1 for chunks in DOCUMENTS * 6)
        np.testing.assert_allclose(
            chunk_rows(context_rows, DOCUMENTS * 6), expected_chunks, atol=TOLERANCE, rtol=0
        )


def test_attention_is_bidirectional_and_chunks_read_their_neighbours(checkpoints):
    """The reference is not the causal model's, and a chunk read in its document is not the chunk alone: the
    checkpoints and texts exercise both."""
    folder, reference = checkpoints["context"]
    _, _, chunks_of, separator = joined(folder, DOCUMENTS[:1])
    ids = chunks_of[0][0]
    for layer in reference.layers:
        layer.self_attn.is_causal = True
    try:
        with torch.inference_mode():
            causal = reference(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0).numpy()
    finally:
        for layer in reference.layers:
            layer.self_attn.is_causal = False
    bidirectional = hidden_states(reference, ids).mean(0).numpy()
    assert np.abs(causal - bidirectional).max() > 100 * TOLERANCE
    in_document = reference_chunks(reference, chunks_of[0], separator)[0]
    assert np.abs(in_document - bidirectional).max() > 100 * TOLERANCE
