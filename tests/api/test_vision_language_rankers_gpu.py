"""The vision-language rankers on CUDA in bf16, through HTTP, against transformers' fp32 on the same
layouts (the CPU tests' references): jina-reranker-m0 (Qwen2-VL, vision heads of 80 as Qwen2-VL-2B has),
Qwen3-VL-Reranker (Qwen3-VL, vision heads of 64), ColQwen2 (MaxSim on the device) and ColPali (PaliGemma,
vision heads of 72 as SigLIP-so400m has, decoder heads of 128, multi-query); text documents
through CUDA graphs, image documents, an image query (not ColQwen2's), against an image document too;
each score within 1e-2 (sigmoids of logits near 0, or means of cosines: a bf16 error)."""

import numpy as np
import pytest
import torch
from litestar.testing import TestClient

from api.app import create_app
from api.config import EngineFlags, ServerConfig
from benchmarks.image_checkpoints import (
    TINY_PALIGEMMA_TEXT,
    TINY_PALIGEMMA_VISION,
    colpali_checkpoint,
    colpali_vectors,
    colqwen2_checkpoint,
    jina_ranker_checkpoint,
    qwen3_vl_judge_checkpoint,
)
from tests.api import test_colqwen as colqwen
from tests.api import test_vision_language_judge as judge
from tests.api import test_vision_language_ranker as jina
from tests.api.test_vision_language_inputs import IMAGES, data_uri
from tests.engine.test_vision_language_gpu import KINDS, TEXT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
TOLERANCE = 1e-2
QUERY, TEXTS = judge.QUERY, judge.TEXTS


def max_sim_scores(vectors, pairs) -> list[float]:
    """A multi-vector retriever's rerank scores of (query, document) pairs from `vectors` of items."""
    query = vectors([pairs[0][0]])[0]
    documents = vectors([pair[1] for pair in pairs])
    return [(1 + colqwen.max_sim(query, document) / len(query)) / 2 for document in documents]


def checkpoint(kind: str, folder):
    if kind == "colpali":
        text = {**TINY_PALIGEMMA_TEXT, "hidden_size": 256, "num_attention_heads": 2, "head_dim": 128}
        vision = {**TINY_PALIGEMMA_VISION, "hidden_size": 144, "num_attention_heads": 2}
        folder, model = colpali_checkpoint(folder, text=text, vision=vision, std=0.05)
        return folder, lambda pairs: max_sim_scores(
            lambda items: colpali_vectors(model, folder, items), pairs
        )
    vision, sections = KINDS["qwen3_vl" if kind == "qwen3-vl-judge" else "qwen2_vl"]
    shape = {"text": TEXT, "vision": vision, "mrope_section": sections}
    if kind == "jina":
        folder, model, score = jina_ranker_checkpoint(folder, std=0.05, **shape)
        return folder, lambda pairs: jina.reference_scores(model, score, folder, pairs)
    if kind == "colqwen2":
        folder, model, projection = colqwen2_checkpoint(folder, std=0.05, **shape)
        return folder, lambda pairs: max_sim_scores(
            lambda items: colqwen.reference_vectors(model, projection, folder, items), pairs
        )
    # Qwen3-VL-Reranker
    folder, model = qwen3_vl_judge_checkpoint(folder, tied=False, std=0.05, **shape)
    return folder, lambda pairs: judge.reference_scores(model, folder, pairs)


@pytest.mark.parametrize("kind", ["jina", "qwen3-vl-judge", "colqwen2", "colpali"])
def test_rankers_in_bf16_match_fp32(tmp_path, kind):
    folder, reference = checkpoint(kind, tmp_path / kind)
    engine = EngineFlags("cuda", "bfloat16")
    config = ServerConfig(models=(str(folder),), served_model_names=(("ranker",),), engine=engine)
    documents = [{"image": data_uri(IMAGES[0])}, TEXTS[0], {"image": data_uri(IMAGES[1])}]
    image_query = {"content": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[1])}}]}
    cases = [
        ({"query": QUERY, "documents": TEXTS}, [(QUERY, text) for text in TEXTS]),
        (
            {"query": QUERY, "documents": documents},
            [(QUERY, IMAGES[0]), (QUERY, TEXTS[0]), (QUERY, IMAGES[1])],
        ),
    ]
    if not kind.startswith("col"):  # ColQwen2 and ColPali embed a query from its text
        cases.append(({"query": image_query, "documents": TEXTS}, [(IMAGES[1], text) for text in TEXTS]))
        two = {"query": image_query, "documents": [{"image": data_uri(IMAGES[0])}]}  # both in one sequence
        cases.append((two, [(IMAGES[1], IMAGES[0])]))
    with TestClient(create_app(config)) as client:
        for body, pairs in cases:
            expected = reference(pairs)
            for _ in range(3):  # eagerly, then captured, then replayed (texts)
                response = client.post("/v2/rerank", json={"model": "ranker", **body})
                got = jina.scores_of(response)
                np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
