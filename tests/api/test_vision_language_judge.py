"""Qwen3-VL-Reranker (engine/models/vision_language_ranker.py) through rerank on tiny random checkpoints in
its layout (a Qwen3VLForConditionalGeneration its model card files under text ranking), its LM head tied
to its embeddings and its own: each pair laid out as its reranker code lays it out (the judge's system
turn, "<Instruct>: {instruction}<Query>:{query}\\n<Document>:{document}" in the user turn, an image's vision
tokens right after its "<Query>:" or "<Document>:", the assistant's prompt), scored sigmoid of the "yes"
row of its LM head less the "no" row at the last token, within 1e-5 of transformers' model on that layout
in one string with its own image processor; texts, an instruction, image documents, an image query (against
image documents too), a document whose first character would join the seam; vLLM's /score; a Qwen3-VL
checkpoint whose card says nothing of ranking embeds."""

import numpy as np
import pytest
import torch
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from benchmarks.image_checkpoints import image_part, qwen3_vl_judge_checkpoint
from engine.checkpoint.resolve import resolve_model
from tests.api.test_vision_language_inputs import IMAGES, data_uri
from tests.api.test_vision_language_ranker import scores_of

TOLERANCE = 1e-5
QUERY = "a photo of a cat"
TEXTS = ["two dogs on a beach", "a cat asleep in the sun", "(a cat) on a mat"]
SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
)
DEFAULT_INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."


def reference_scores(model, folder, pairs, instruction=DEFAULT_INSTRUCTION) -> np.ndarray:
    """transformers' scores of (query, document) pairs, each a text or a PNG, laid out in one string as
    Qwen3-VL-Reranker's format_mm_instruction and chat template lay them out."""
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    processor = AutoImageProcessor.from_pretrained(folder)
    yes, no = tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")
    judge = model.lm_head.weight[yes] - model.lm_head.weight[no]
    scores = []

    def part(item, inputs: dict) -> str:
        return item if isinstance(item, str) else image_part(processor, item, inputs)

    for query, document in pairs:
        inputs = {}
        user = f"<Instruct>: {instruction}<Query>:{part(query, inputs)}\n<Document>:{part(document, inputs)}"
        text = f"{SYSTEM}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False).ids])
        if inputs:
            inputs["mm_token_type_ids"] = (ids == model.config.image_token_id).int()
        with torch.inference_mode():
            hidden = model.model(input_ids=ids, **inputs).last_hidden_state[0, -1]
            scores.append(torch.sigmoid(hidden @ judge).item())
    return np.array(scores)


@pytest.fixture(scope="module", params=[False, True], ids=["own-lm-head", "tied-lm-head"])
def served(request, tmp_path_factory):
    folder, model = qwen3_vl_judge_checkpoint(tmp_path_factory.mktemp("judge") / "judge", tied=request.param)
    config = ServerConfig(models=(str(folder),), served_model_names=(("judge",),), tokenizer_threads=2)
    with TestClient(create_app(config)) as client:
        yield client, lambda pairs, **kwargs: reference_scores(model, folder, pairs, **kwargs)


def test_texts_judged_as_qwen3_vl_reranker_lays_them_out(served):
    client, reference = served
    expected = reference([(QUERY, text) for text in TEXTS])
    assert np.ptp(expected) > 100 * TOLERANCE  # the scores differ: the comparison can fail
    for route in ("/v1/rerank", "/v2/rerank"):
        response = client.post(route, json={"model": "judge", "query": QUERY, "documents": TEXTS})
        np.testing.assert_allclose(scores_of(response), expected, atol=TOLERANCE, rtol=0)
    response = client.post("/score", json={"model": "judge", "text_1": QUERY, "text_2": TEXTS})
    assert response.status_code == 200, response.text
    got = [item["score"] for item in response.json()["data"]]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
    # the request's instruction replaces the default one
    instruction = "Find the picture of the animal"
    body = {"model": "judge", "query": QUERY, "documents": TEXTS, "instruction": instruction}
    expected = reference([(QUERY, text) for text in TEXTS], instruction=instruction)
    np.testing.assert_allclose(
        scores_of(client.post("/v2/rerank", json=body)), expected, atol=TOLERANCE, rtol=0
    )


def test_image_documents_and_an_image_query(served):
    client, reference = served
    documents = [{"image": data_uri(IMAGES[0])}, TEXTS[2], {"image": data_uri(IMAGES[1])}]
    instruction = "Find the picture of the animal"
    body = {"model": "judge", "query": QUERY, "documents": documents, "instruction": instruction}
    response = client.post("/v2/rerank", json=body)
    expected = reference([(QUERY, IMAGES[0]), (QUERY, TEXTS[2]), (QUERY, IMAGES[1])], instruction=instruction)
    np.testing.assert_allclose(scores_of(response), expected, atol=TOLERANCE, rtol=0)
    # an image query against texts, as vLLM's content parts send it
    query = {"content": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[1])}}]}
    response = client.post("/v1/rerank", json={"model": "judge", "query": query, "documents": TEXTS})
    expected = reference([(IMAGES[1], text) for text in TEXTS])
    np.testing.assert_allclose(scores_of(response), expected, atol=TOLERANCE, rtol=0)


def test_an_image_query_against_image_documents(served):
    client, reference = served
    query = {"image": data_uri(IMAGES[1])}
    documents = [{"image": data_uri(IMAGES[0])}, TEXTS[1]]
    response = client.post("/v2/rerank", json={"model": "judge", "query": query, "documents": documents})
    expected = reference([(IMAGES[1], IMAGES[0]), (IMAGES[1], TEXTS[1])])
    np.testing.assert_allclose(scores_of(response), expected, atol=TOLERANCE, rtol=0)


def test_texts_beside_an_image_that_spell_its_tokens_are_400s(served):
    """A text that shares a pair with an image may not spell the model's vision tokens (they would be
    placeholders no image fills), nor may an instruction hold the mark the server lays images out by;
    each a 400 naming it, and the server ranks on."""
    client, reference = served
    image = {"image": data_uri(IMAGES[0])}
    cases = [
        ({"query": "a cat <|image_pad|>", "documents": [image]}, "query holds a token"),
        ({"query": QUERY, "documents": [image, "a <|vision_start|> dog"]}, "documents[1] holds a token"),
        ({"query": image, "documents": TEXTS, "instruction": "find \x00posy-image\x00 it"}, "instruction"),
    ]
    for body, needle in cases:
        response = client.post("/v2/rerank", json={"model": "judge", **body})
        assert response.status_code == 400, response.text
        assert needle in response.json()["message"], response.text
    response = client.post("/v2/rerank", json={"model": "judge", "query": QUERY, "documents": [image]})
    np.testing.assert_allclose(scores_of(response), reference([(QUERY, IMAGES[0])]), atol=TOLERANCE, rtol=0)


def test_a_qwen3_vl_checkpoint_without_a_ranking_card_embeds(tmp_path):
    folder, _ = qwen3_vl_judge_checkpoint(tmp_path / "judge", tied=False)
    assert resolve_model(str(folder)).task == "score"
    (folder / "README.md").write_text("---\npipeline_tag: feature-extraction\n---\n# An embedder\n")
    assert resolve_model(str(folder)).task == "embed"


def test_a_qwen3_vl_checkpoint_without_a_card_embeds_and_says_so(tmp_path, caplog):
    folder, _ = qwen3_vl_judge_checkpoint(tmp_path / "judge", tied=False)
    (folder / "README.md").unlink()
    with caplog.at_level("WARNING"):
        assert resolve_model(str(folder)).task == "embed"
    assert "pipeline_tag: text-ranking" in caplog.text
