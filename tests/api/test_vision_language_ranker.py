"""jina-reranker-m0 (engine/models/vision_language_ranker.py) through /v1 and /v2 rerank on a tiny random
checkpoint in its layout (Qwen2-VL without its LM head, the `score` MLP beside it): each pair laid out as
its modeling code lays it out, "**Document**:\n{document}\n**Query**:\n{query}" and its score token, an
image's vision tokens where its text would be, scored sigmoid(logit - 2.65), within 1e-5 of transformers'
Qwen2VLModel and the MLP on that layout with its own image processor; texts alone, image documents, an
image query, and an image query against image documents (two images in a pair)."""

import numpy as np
import pytest
import torch
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from benchmarks.image_checkpoints import image_part, jina_ranker_checkpoint
from tests.api.test_vision_language_inputs import IMAGES, data_uri

TOLERANCE = 1e-5
QUERY = "a photo of a cat"
TEXTS = ["two dogs on a beach", "a cat asleep in the sun"]
SCORE_TOKEN = 100


def reference_scores(model, score, folder, pairs) -> np.ndarray:
    """transformers' scores of (query, document) pairs, each a text or a PNG, laid out in one string as
    jina-reranker-m0's compute_score lays them out, its score token appended."""
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    processor = AutoImageProcessor.from_pretrained(folder)
    scores = []

    def part(item, inputs: dict) -> str:
        return item if isinstance(item, str) else image_part(processor, item, inputs)

    for query, document in pairs:
        inputs = {}
        text = f"**Document**:\n{part(document, inputs)}\n**Query**:\n{part(query, inputs)}"
        ids = torch.tensor([[*tokenizer.encode(text, add_special_tokens=False).ids, SCORE_TOKEN]])
        if inputs:
            inputs["mm_token_type_ids"] = (ids == model.config.image_token_id).int()
        with torch.inference_mode():
            hidden = model.model(input_ids=ids, **inputs).last_hidden_state[0, -1]
            scores.append(torch.sigmoid(score(hidden)[0] - 2.65).item())
    return np.array(scores)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return jina_ranker_checkpoint(tmp_path_factory.mktemp("jina") / "jina")


@pytest.fixture(scope="module")
def served(checkpoint):
    folder, model, score = checkpoint
    config = ServerConfig(models=(str(folder),), served_model_names=(("m0",),), tokenizer_threads=2)
    with TestClient(create_app(config)) as client:
        yield client, lambda pairs: reference_scores(model, score, folder, pairs)


def scores_of(response) -> list[float]:
    assert response.status_code == 200, response.text
    got = {result["index"]: result["relevance_score"] for result in response.json()["results"]}
    return [got[index] for index in range(len(got))]


def test_texts_ranked_as_jina_reranker_m0_lays_them_out(served):
    client, reference = served
    expected = reference([(QUERY, text) for text in TEXTS])
    for route in ("/v1/rerank", "/v2/rerank"):
        response = client.post(route, json={"model": "m0", "query": QUERY, "documents": TEXTS})
        np.testing.assert_allclose(scores_of(response), expected, atol=TOLERANCE, rtol=0)
    # vLLM's /score and TEI's /rerank lay the pairs out alike
    response = client.post("/score", json={"model": "m0", "text_1": QUERY, "text_2": TEXTS})
    assert response.status_code == 200, response.text
    got = [item["score"] for item in response.json()["data"]]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
    response = client.post("/rerank", json={"model": "m0", "query": QUERY, "texts": TEXTS})
    assert response.status_code == 200, response.text
    got = {item["index"]: item["score"] for item in response.json()}
    np.testing.assert_allclose([got[0], got[1]], expected, atol=TOLERANCE, rtol=0)


def test_image_documents_and_an_image_query(served):
    client, reference = served
    documents = [{"image": data_uri(IMAGES[0])}, TEXTS[0], {"image": data_uri(IMAGES[1])}]
    response = client.post("/v2/rerank", json={"model": "m0", "query": QUERY, "documents": documents})
    expected = reference([(QUERY, IMAGES[0]), (QUERY, TEXTS[0]), (QUERY, IMAGES[1])])
    np.testing.assert_allclose(scores_of(response), expected, atol=TOLERANCE, rtol=0)
    assert response.json()["results"][0]["index"] == int(np.argmax(expected))
    # an image query against texts, as vLLM's content parts send it
    query = {"content": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[1])}}]}
    response = client.post("/v2/rerank", json={"model": "m0", "query": query, "documents": TEXTS})
    expected = reference([(IMAGES[1], text) for text in TEXTS])
    np.testing.assert_allclose(scores_of(response), expected, atol=TOLERANCE, rtol=0)


def test_an_image_query_against_image_documents(served):
    """Both images in each pair's sequence, the document's first, as its layout places them."""
    client, reference = served
    query = {"image": data_uri(IMAGES[0])}
    documents = [TEXTS[0], {"image": data_uri(IMAGES[1])}, {"image": data_uri(IMAGES[0])}]
    response = client.post("/v2/rerank", json={"model": "m0", "query": query, "documents": documents})
    expected = reference([(IMAGES[0], TEXTS[0]), (IMAGES[0], IMAGES[1]), (IMAGES[0], IMAGES[0])])
    np.testing.assert_allclose(scores_of(response), expected, atol=TOLERANCE, rtol=0)


def test_image_documents_in_groups_of_what_the_threads_decode_at_once(checkpoint):
    """On one image thread each image document goes to the engine in a group of its own (its texts with
    it): the scores are the same, in the request's order, and a bad text is named by its place in the
    request, not in its group."""
    folder, model, score = checkpoint
    config = ServerConfig(models=(str(folder),), served_model_names=(("m0",),), image_threads=1)
    documents = [{"image": data_uri(IMAGES[0])}, TEXTS[0], {"image": data_uri(IMAGES[1])}, TEXTS[1]]
    expected = reference_scores(model, score, folder, [(QUERY, IMAGES[0]), (QUERY, TEXTS[0]),
                                                       (QUERY, IMAGES[1]), (QUERY, TEXTS[1])])  # fmt: skip
    with TestClient(create_app(config)) as client:
        response = client.post("/v2/rerank", json={"model": "m0", "query": QUERY, "documents": documents})
        np.testing.assert_allclose(scores_of(response), expected, atol=TOLERANCE, rtol=0)
        documents[3] = "a <|vision_start|> dog"
        response = client.post("/v2/rerank", json={"model": "m0", "query": QUERY, "documents": documents})
        assert response.status_code == 400, response.text
        assert "documents[3] holds a token" in response.json()["message"]
