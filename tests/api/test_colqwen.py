"""ColQwen2 (transformers' ColQwen2ForRetrieval: Qwen2-VL under a projection, engine/models/late_interaction)
on a tiny random checkpoint: each query and document laid out as its processor lays it out (a query
"Query: {text}" and ten <|endoftext|> then a newline; an image document its vision tokens in "<|im_start|>user
\\n...Describe the image.<|im_end|><|endoftext|>"), every token's projected unit vector within 1e-5 of
transformers' Qwen2-VL (M-RoPE over the image's grid, as colpali-engine runs it) with its own image processor;
rerank by MaxSim against image and text documents; /pooling's token vectors of queries and of image
documents; an image query is a 400."""

import io
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from litestar.testing import TestClient
from PIL import Image

from api.app import create_app
from api.config import ServerConfig
from benchmarks.image_checkpoints import colqwen2_checkpoint
from tests.api.test_vision_language_inputs import IMAGES, data_uri
from tests.api.test_vision_language_ranker import scores_of

TOLERANCE = 1e-5
QUERY = "a photo of a cat"
TEXTS = ["two dogs on a beach", "a cat asleep in the sun"]
QUERY_LAYOUT = "Query: {}" + "<|endoftext|>" * 10 + "\n"
IMAGE_LAYOUT = "<|im_start|>user\n{}Describe the image.<|im_end|><|endoftext|>"


def reference_vectors(model, projection, folder, items, query_layout=QUERY_LAYOUT) -> list[np.ndarray]:
    """colpali-engine's token vectors of each item, a text laid out as a query, a PNG as an image document,
    a list the token ids of a text laid out already: Qwen2-VL's last hidden states (its M-RoPE positions
    from the image's grid), projected, normalized."""
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    processor = AutoImageProcessor.from_pretrained(folder)
    vectors = []
    for item in items:
        inputs = {}
        if isinstance(item, str):
            text = query_layout.format(item)
        elif isinstance(item, bytes):
            pixels = processor(images=[Image.open(io.BytesIO(item))], return_tensors="pt")
            inputs = {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"]}
            pads = "<|image_pad|>" * int(pixels["image_grid_thw"].prod() // 4)
            text = IMAGE_LAYOUT.format(f"<|vision_start|>{pads}<|vision_end|>")
        ids = torch.tensor(
            [item if isinstance(item, list) else tokenizer.encode(text, add_special_tokens=False).ids]
        )
        if inputs:
            inputs["mm_token_type_ids"] = (ids == model.config.image_token_id).int()
        with torch.inference_mode():
            hidden = model.model(input_ids=ids, **inputs).last_hidden_state[0]
            vectors.append(F.normalize(projection(hidden), dim=-1).numpy())
    return vectors


def max_sim(query: np.ndarray, document: np.ndarray) -> float:
    return float((query @ document.T).max(axis=1).sum())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return colqwen2_checkpoint(tmp_path_factory.mktemp("colqwen") / "colqwen")


@pytest.fixture(scope="module")
def served(checkpoint):
    folder, model, projection = checkpoint
    config = ServerConfig(models=(str(folder),), served_model_names=(("colqwen",),), tokenizer_threads=2)
    with TestClient(create_app(config)) as client:
        yield client, lambda items: reference_vectors(model, projection, folder, items)


# what both multi-vector image retrievers (ColQwen2 here, ColPali in test_colpali.py) are held to, served as
# `model` by `client`, against `reference` (transformers' token vectors of texts as queries and of PNGs)


def check_rerank(client, reference, model: str) -> np.ndarray:
    """Rerank of image and text documents by MaxSim of the query's vectors, through both routes -> the
    raw MaxSims of the documents (two images, two texts, in IMAGES and TEXTS order, interleaved)."""
    query, *documents = reference([QUERY, IMAGES[0], TEXTS[0], IMAGES[1], TEXTS[1]])
    raw = np.array([max_sim(query, document) for document in documents])
    assert np.ptp(raw) > 100 * TOLERANCE  # the scores differ: the comparison can fail
    body = {
        "model": model,
        "query": QUERY,
        "documents": [{"image": data_uri(IMAGES[0])}, TEXTS[0], {"image": data_uri(IMAGES[1])}, TEXTS[1]],
    }
    for route in ("/v1/rerank", "/v2/rerank"):
        response = client.post(route, json=body)
        np.testing.assert_allclose(scores_of(response), (1 + raw / len(query)) / 2, atol=TOLERANCE, rtol=0)
    return raw / len(query)


def check_query_vectors(client, reference, model: str) -> None:
    expected = reference([QUERY, TEXTS[0]])
    body = {"model": model, "input": [QUERY, TEXTS[0]], "task": "token_embed", "input_type": "query"}
    response = client.post("/pooling", json=body)
    assert response.status_code == 200, response.text
    for item, vectors in zip(response.json()["data"], expected):
        np.testing.assert_allclose(np.array(item["data"]), vectors, atol=TOLERANCE, rtol=0)


def check_image_document_vectors(client, reference, model: str) -> None:
    """/pooling's token_embed of images (content parts among the texts): every token's vector of the image
    document as the processor lays it out, for indexing pages; a text beside it as a document."""
    expected = reference([IMAGES[1], TEXTS[1], IMAGES[0]])
    parts = [{"type": "image_url", "image_url": {"url": data_uri(data)}} for data in IMAGES]
    body = {"model": model, "input": [parts[1], TEXTS[1], parts[0]], "task": "token_embed"}
    response = client.post("/pooling", json=body)
    assert response.status_code == 200, response.text
    payload = response.json()
    for item, vectors in zip(payload["data"], expected):
        np.testing.assert_allclose(np.array(item["data"]), vectors, atol=TOLERANCE, rtol=0)
    assert payload["usage"]["prompt_tokens"] == sum(len(vectors) for vectors in expected)


def check_long_text_cut_keeps_its_closing_tokens(client, reference, model: str, folder, layout: str) -> None:
    """A text document past max_tokens_per_doc is cut to it as the processor lays it out, its closing
    tokens (ten pads and a newline) kept at the end: its vectors are those of the cut text's tokens before
    them, then the closing's; cut plainly, they would be all the text's."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    document, max_tokens = " ".join(TEXTS * 20), 24
    laid_out = tokenizer.encode(layout.format(document), add_special_tokens=False).ids
    closing = tokenizer.encode(layout.split("{}")[1], add_special_tokens=False).ids
    assert len(closing) == 11 and laid_out[-len(closing) :] == closing and len(laid_out) > 4 * max_tokens
    cut = laid_out[: max_tokens - len(closing)] + closing
    query, kept, plain = reference([QUERY, cut, laid_out[:max_tokens]])
    expected = (1 + max_sim(query, kept) / len(query)) / 2
    assert abs(expected - (1 + max_sim(query, plain) / len(query)) / 2) > 100 * TOLERANCE
    # texts alone and beside an image take two paths (scoring/rerank.py, api/image_rerank.py)
    for documents in ([document], [document, {"image": data_uri(IMAGES[0])}]):
        body = {"model": model, "query": QUERY, "documents": documents, "max_tokens_per_doc": max_tokens}
        response = client.post("/v2/rerank", json=body)
        np.testing.assert_allclose(scores_of(response)[0], expected, atol=TOLERANCE, rtol=0)


def check_long_text_chunks_keep_their_layout(client, reference, model: str, folder, layout: str) -> None:
    """A text document past the window is ranked by its best chunk, each chunk laid out as the processor
    lays out a text: the layout's opening (its lead) before it, its closing tokens after it."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    window = json.loads((folder / "config.json").read_text())
    window = (window.get("vlm_config") or window)["text_config"]["max_position_embeddings"]
    opening, ending = layout.split("{}")
    lead = tokenizer.encode(opening.rstrip(), add_special_tokens=False).ids
    closing = tokenizer.encode(ending, add_special_tokens=False).ids
    document = " ".join(TEXTS * 40)
    laid_out = tokenizer.encode(layout.format(document), add_special_tokens=False).ids
    assert 2 * window < len(laid_out) < 3 * window and laid_out[-len(closing) :] == closing
    body, room = laid_out[: -len(closing)], window - len(closing)
    step = room - len(lead)
    chunks = [body[:room], *(lead + body[start : start + step] for start in range(room, len(body), step))]
    plain = [
        laid_out[:window],
        *(
            lead + laid_out[s : s + window - len(lead)]
            for s in range(window, len(laid_out), window - len(lead))
        ),
    ]
    query, *vectors = reference([QUERY, *(chunk + closing for chunk in chunks), *plain])
    scores = [max_sim(query, chunk) for chunk in vectors]
    expected = (1 + max(scores[: len(chunks)]) / len(query)) / 2
    assert abs(expected - (1 + max(scores[len(chunks) :]) / len(query)) / 2) > 100 * TOLERANCE
    for route in ("/v1/rerank", "/v2/rerank"):
        response = client.post(route, json={"model": model, "query": QUERY, "documents": [document]})
        np.testing.assert_allclose(scores_of(response)[0], expected, atol=TOLERANCE, rtol=0)


def check_image_query_refused(client, model: str) -> None:
    """An image query is a 400 on /pooling and rerank, and the server ranks on."""
    part = {"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}
    body = {"model": model, "input": [part], "task": "token_embed", "input_type": "query"}
    response = client.post("/pooling", json=body)
    assert response.status_code == 400 and "input_type asks for queries" in response.text, response.text
    query = {"image": data_uri(IMAGES[0])}
    response = client.post("/v2/rerank", json={"model": model, "query": query, "documents": TEXTS})
    assert response.status_code == 400, response.text
    assert "the query is an image" in response.json()["message"]
    response = client.post("/v2/rerank", json={"model": model, "query": QUERY, "documents": TEXTS})
    assert response.status_code == 200, response.text


def test_rerank_by_max_sim_against_images_and_texts(served):
    client, reference = served
    scores = check_rerank(client, reference, "colqwen")
    # texts alone take the ColBERT path: the query once a batch, each text scored against it
    response = client.post("/v2/rerank", json={"model": "colqwen", "query": QUERY, "documents": TEXTS})
    np.testing.assert_allclose(scores_of(response), (1 + scores[[1, 3]]) / 2, atol=TOLERANCE, rtol=0)


def test_token_vectors_of_queries(served):
    check_query_vectors(*served, "colqwen")


def test_token_vectors_of_image_documents_and_texts(served):
    check_image_document_vectors(*served, "colqwen")


def test_a_bulk_job_lays_texts_out_as_the_server_does(checkpoint, tmp_path):
    """posy embed's token vectors of queries are the processor's layout of them, as the server's are."""
    import asyncio

    import pyarrow as pa
    import pyarrow.parquet as pq

    from api.bulk import job
    from api.bulk.config import JobConfig
    from api.bulk.output import read_output
    from api.config import EngineFlags
    from engine.checkpoint.source import ModelSource

    folder, model, projection = checkpoint
    pq.write_table(pa.table({"text": [QUERY, TEXTS[0]]}), tmp_path / "in.parquet")
    config = JobConfig(
        str(tmp_path / "in.parquet"), str(tmp_path / "out"), ModelSource(str(folder)),
        engine=EngineFlags("cpu", "float32"), input_type="query",
    )  # fmt: skip
    assert asyncio.run(job.run_job(config)).rows == 2
    written = read_output(str(tmp_path / "out")).column("embedding").to_pylist()
    expected = reference_vectors(model, projection, folder, [QUERY, TEXTS[0]])
    for vectors, one in zip(written, expected):
        np.testing.assert_allclose(np.array(vectors), one, atol=TOLERANCE, rtol=0)


def test_the_processor_configs_prefixes_lay_texts_out(tmp_path):
    """A processor_config.json's query_prefix (as transformers' ColQwen2Processor reads it) lays texts out;
    one whose visual prompt has no image is refused at start."""
    import json

    from engine.checkpoint.resolve import resolve_model
    from engine.errors import UnsupportedModel

    folder, model, projection = colqwen2_checkpoint(tmp_path / "colqwen")
    (folder / "processor_config.json").write_text(json.dumps({"query_prefix": "Question: "}))
    layout = "Question: {}" + "<|endoftext|>" * 10 + "\n"
    expected = reference_vectors(model, projection, folder, [QUERY], query_layout=layout)
    config = ServerConfig(models=(str(folder),), served_model_names=(("colqwen",),))
    with TestClient(create_app(config)) as client:
        body = {"model": "colqwen", "input": [QUERY], "task": "token_embed", "input_type": "query"}
        response = client.post("/pooling", json=body)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(
        np.array(response.json()["data"][0]["data"]), expected[0], atol=TOLERANCE, rtol=0
    )
    (folder / "processor_config.json").write_text(json.dumps({"visual_prompt_prefix": "Describe it."}))
    with pytest.raises(UnsupportedModel, match="visual prompt"):
        resolve_model(str(folder))


def test_a_long_text_document_cut_to_max_tokens_per_doc_keeps_its_closing_tokens(served, checkpoint):
    check_long_text_cut_keeps_its_closing_tokens(*served, "colqwen", checkpoint[0], QUERY_LAYOUT)


def test_a_text_document_past_the_window_ranks_by_chunks_laid_out_as_texts(served, checkpoint):
    check_long_text_chunks_keep_their_layout(*served, "colqwen", checkpoint[0], QUERY_LAYOUT)


def test_an_image_query_is_a_400_and_the_server_ranks_on(served):
    check_image_query_refused(served[0], "colqwen")


def test_image_documents_in_groups_of_what_the_threads_decode_at_once(checkpoint):
    """On one image thread each image document goes to the engine in a group of its own: the same
    MaxSims, in the request's order."""
    folder, model, projection = checkpoint
    config = ServerConfig(models=(str(folder),), served_model_names=(("colqwen",),), image_threads=1)
    with TestClient(create_app(config)) as client:
        check_rerank(client, lambda items: reference_vectors(model, projection, folder, items), "colqwen")
