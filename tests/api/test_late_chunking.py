"""Late chunking on /v1/embeddings (`late_chunking: true`): one document's chunks read together, each chunk
the mean of its own tokens' states; against transformers' own BertModel over the whole document (the
bundled all-MiniLM-L6-v2, fp32, within 1e-5), across several passes of a shortened window, through engine
replica processes, and the 400s of what it cannot do."""

import asyncio

import numpy as np
import pytest
import torch
from litestar.testing import TestClient
from transformers import AutoModel

from api.app import create_app
from api.config import ServerConfig
from engine.checkpoint.source import ModelFlags, ModelSource
from engine.config import EngineConfig
from engine.outputs import RowRequest
from engine.replicas.replica_set import ReplicaSet

TOLERANCE = 1e-5
CHUNKS = [
    "Berlin is the capital of Germany.",
    "Its more than 3.85 million inhabitants make it the EU's most populous city.",
    "The city is also one of the states of Germany.",
    "It is the third smallest state in the country by area.",
]


def reference(minilm_path, minilm_tokenizer, groups: list[list[str]]) -> np.ndarray:
    """Each group read as [CLS] chunks [SEP] by transformers; each chunk's mean state, normalized."""
    model = AutoModel.from_pretrained(minilm_path).eval()
    cls, sep = minilm_tokenizer.token_to_id("[CLS]"), minilm_tokenizer.token_to_id("[SEP]")
    vectors = []
    for group in groups:
        ids = [encoding.ids for encoding in minilm_tokenizer.encode_batch(group, add_special_tokens=False)]
        with torch.inference_mode():
            states = model(input_ids=torch.tensor([[cls, *sum(ids, []), sep]])).last_hidden_state[0]
        start = 1
        for chunk in ids:
            vectors.append(torch.nn.functional.normalize(states[start : start + len(chunk)].mean(0), dim=0))
            start += len(chunk)
    return torch.stack(vectors).numpy()


def embedded(client, **body) -> tuple[np.ndarray, int]:
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    payload = response.json()
    return np.array([item["embedding"] for item in payload["data"]]), payload["usage"]["prompt_tokens"]


def test_each_chunk_is_the_mean_of_its_tokens_read_with_the_whole_document(
    client, minilm_path, minilm_tokenizer
):
    vectors, num_tokens = embedded(client, input=CHUNKS, late_chunking=True)
    expected = reference(minilm_path, minilm_tokenizer, [CHUNKS])
    np.testing.assert_allclose(vectors, expected, atol=TOLERANCE)
    alone, _ = embedded(client, input=CHUNKS)
    assert (np.sum(alone * vectors, axis=1) < 0.99).all()  # a chunk read alone is another vector
    content = minilm_tokenizer.encode_batch(CHUNKS, add_special_tokens=False)
    assert num_tokens == sum(len(encoding.ids) for encoding in content) + 2  # one [CLS] and [SEP]


def test_a_document_past_the_window_is_read_in_passes_at_chunk_borders(minilm_path, minilm_tokenizer):
    """A 32-token window, 30 of them for text: the chunks of 7, 18, 11 and 12 tokens go two by two."""
    with TestClient(create_app(ServerConfig(model_flags=ModelFlags(max_model_len=32)))) as client:
        vectors, _ = embedded(client, input=CHUNKS, late_chunking=True)
        too_long = client.post("/v1/embeddings", json={"input": [CHUNKS[1] * 3], "late_chunking": True})
        cut, _ = embedded(client, input=[CHUNKS[1] * 3], late_chunking=True, truncate_prompt_tokens=-1)
    expected = reference(minilm_path, minilm_tokenizer, [CHUNKS[:2], CHUNKS[2:]])
    np.testing.assert_allclose(vectors, expected, atol=TOLERANCE)
    assert too_long.status_code == 400 and "maximum of 32" in too_long.json()["error"]["message"]
    assert cut.shape == (1, 384)


def test_replicas_pool_spans_as_the_engine_in_process(minilm_tokenizer):
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model

    ids = [encoding.ids for encoding in minilm_tokenizer.encode_batch(CHUNKS * 3, add_special_tokens=False)]
    sequences = [[101, *sum(ids[i : i + 4], []), 102] for i in range(0, 12, 4)]
    spans = [None, [1, 5, 9], [3]]
    config = EngineConfig(max_batch_tokens=256, max_queue_tokens=10**5, dtype="float32")
    engine = build_engine(resolve_model(None), config)
    replica_set = ReplicaSet(ModelSource(), 2, config)
    replica_set.start()

    async def both():
        pooled = RowRequest(spans=spans)
        return await engine.run(sequences, rows=pooled), await replica_set.pool.run(sequences, rows=pooled)

    try:
        in_process, replicated = asyncio.run(asyncio.wait_for(both(), 120))
    finally:
        engine.stop()
        replica_set.stop()
    assert in_process.shape == (1 + 4 + 2, 384)
    np.testing.assert_allclose(replicated, in_process, atol=TOLERANCE)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": [[101, 2023, 102]], "late_chunking": True}, "texts"),
        ({"input": ["a", " "], "late_chunking": True}, "no tokens"),
    ],
)
def test_what_late_chunking_cannot_do_is_a_400(client, body, named):
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    assert named in response.json()["error"]["message"]


def test_late_chunking_needs_a_mean_pooling_embedder(minilm_path, tmp_path):
    from benchmarks.token_checkpoints import m3_checkpoint

    folder = m3_checkpoint(minilm_path, tmp_path / "m3")
    with TestClient(create_app(ServerConfig(models=(str(folder),)))) as client:
        response = client.post("/v1/embeddings", json={"input": ["a", "b"], "late_chunking": True})
    assert response.status_code == 400 and "pools by cls" in response.json()["error"]["message"]
