"""Each model family served end to end from a tiny random checkpoint, all of them by one multi-model server
(`posy serve --model <folder> --served-model-name <id> ...`), and what the official SDKs get back checked
against transformers on the same weights, fp32 on the CPU: "same vector" is cosine >= 0.9999
(SAME_VECTOR), scores agree within 1e-4 absolute. Every model type of posy's table is among them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import cohere
import httpx
import numpy as np
import openai
import pytest
from tokenizers import Tokenizer
from torch import nn

from engine.checkpoint.folder import WRAPPED_CONFIGS
from engine.models.registry import MODEL_TYPES

from .conftest import REPO_ROOT, ServerFactory, free_port, server_env
from .contract import SAME_VECTOR, cohere_client, cosine
from .families import (
    COLPALI,
    CPU_FLOAT32,
    CROSS_ENCODERS,
    DUAL_ENCODERS,
    EMBEDDERS,
    JUDGE_INSTRUCTION,
    LOGIT_SCORE_RERANKER,
    MAX_POSITIONS,
    QWEN3_EMBEDDING,
    QWEN3_EMBEDDING_PROMPTS,
    QWEN3_RERANKER,
    SIGLIP,
    SIGLIP2,
    VISION_LANGUAGE,
    Family,
    bidirectional_mean_vector,
    build_gpt2,
    dense_mean_vector,
    judge_probability,
    mean_vector,
    normalized_mean_vector,
)

SCORE_TOLERANCE = 1e-4
TEXTS = [
    "What is the capital of France?",
    "Emperor penguins raise their chicks on the Antarctic sea ice through the long dark winter.",
    "Someone plays an old guitar by the river at night.",  # words the tokenizers were not trained on
]
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Bananas are a yellow fruit rich in potassium.",
    "Paris is the capital and largest city of France.",
    "The Eiffel Tower was finished in 1889.",
    "The train to Berlin leaves from platform nine.",
]
MEAN_POOLED = (mean_vector, normalized_mean_vector, dense_mean_vector, bidirectional_mean_vector)
CUSTOM_INSTRUCTION = "Given a product question, find the customer review that answers it"
UNSUPPORTED_EXIT_TIMEOUT_S = 60.0
# what the one server serves: every generic family, and the families with tests of their own
SERVED = [
    *EMBEDDERS, *CROSS_ENCODERS, QWEN3_RERANKER, LOGIT_SCORE_RERANKER, *DUAL_ENCODERS,
    *VISION_LANGUAGE.values(), COLPALI,
]  # fmt: skip


@dataclass(slots=True)
class Served:
    family: Family
    folder: Path
    url: str
    reference: nn.Module  # transformers, on the weights the server loaded
    tokenizer: Tokenizer  # the checkpoint's tokenizer.json, as transformers' fast tokenizer runs it

    def ids(self, text: str, pair: str | None = None) -> list[int]:
        return self.tokenizer.encode(text, pair).ids

    def vector(self, text: str, reference: nn.Module | None = None) -> np.ndarray:
        vector = self.family.reference(reference or self.reference, self.ids(text))
        return np.asarray(vector, dtype=np.float32)


@pytest.fixture(scope="module")
def serve(server_factory: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Served]:
    """Every family's checkpoint, and one live server of all of them, kept for the module; `alone`: a
    server of the family's model only, for TEI's routes, which name no model (they take the first that
    can do the task)."""
    folders = {family.id: tmp_path_factory.mktemp(family.id) for family in SERVED}
    references = {family.id: family.build(folders[family.id]) for family in SERVED}
    models = [arg for family in SERVED for arg in family.model_args(folders[family.id])]
    server = server_factory(*models, *CPU_FLOAT32)

    def serve(family: Family, alone: bool = False) -> Served:
        folder = folders[family.id]
        url = server_factory(*family.model_args(folder), *CPU_FLOAT32).url if alone else server.url
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return Served(family, folder, url, references[family.id], tokenizer)

    return serve


@pytest.fixture(scope="module")
def qwen3_embedding(serve) -> Served:
    return serve(QWEN3_EMBEDDING)


@pytest.fixture(scope="module")
def qwen3_reranker(serve) -> Served:
    return serve(QWEN3_RERANKER)


def openai_client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0, timeout=60.0)


def cohere_rerank(served: Served, version: str, **kwargs):
    client_class = cohere.Client if version == "v1" else cohere.ClientV2
    with cohere_client(client_class, served.url, timeout=60.0) as client:
        return client.rerank(model=served.family.id, **kwargs)


def post(served: Served, path: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=served.url, timeout=60.0, trust_env=False) as client:
        return client.post(path, json=body)


def vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit))


def assert_ranked_as(ranked: Sequence[tuple[int, float]], expected: Sequence[float]) -> None:
    """(index, score) in the served order: every document once, each score the expected one, and
    the documents in descending order of the expected scores."""
    assert sorted(index for index, _ in ranked) == list(range(len(expected)))
    for index, score in ranked:
        assert score == pytest.approx(expected[index], abs=SCORE_TOLERANCE), (index, score, expected)
    assert [index for index, _ in ranked] == np.argsort(-np.asarray(expected), kind="stable").tolist()


def cohere_ranked(response) -> list[tuple[int, float]]:
    return [(result.index, result.relevance_score) for result in response.results]


def family_ids(families: Sequence[Family]) -> list:
    return [pytest.param(family, id=family.id) for family in families]


# every family: embedders to /v1/embeddings, cross-encoders to /v1/rerank and /v2/rerank


@pytest.mark.parametrize("encoding_format", ["sdk-default-base64", "float"])
@pytest.mark.parametrize("family", family_ids(EMBEDDERS))
def test_embeddings_equal_the_reference(serve, family, encoding_format):
    served = serve(family)
    options = {} if encoding_format == "sdk-default-base64" else {"encoding_format": "float"}
    with openai_client(served) as client:
        response = client.embeddings.create(model=family.id, input=TEXTS, **options)
    assert response.model == family.id
    assert [item.index for item in response.data] == list(range(len(TEXTS)))
    token_ids = [served.ids(text) for text in TEXTS]
    assert min(map(len, token_ids)) > family.min_tokens
    assert response.usage.prompt_tokens == sum(map(len, token_ids))
    for text, ours in zip(TEXTS, vectors(response)):
        expected = served.vector(text)
        assert ours.shape == (family.dimensions,)
        assert cosine(ours, expected) >= SAME_VECTOR, text
        assert np.linalg.norm(ours) == pytest.approx(np.linalg.norm(expected), rel=1e-4)
        if family.normalized:
            assert np.linalg.norm(ours) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("family", family_ids(CROSS_ENCODERS))
def test_cross_encoder_scores_are_the_sigmoid_of_the_reference_logit(serve, family, version):
    served = serve(family)
    response = cohere_rerank(served, version, query=QUERY, documents=DOCUMENTS)
    pairs = [served.ids(QUERY, document) for document in DOCUMENTS]
    assert min(map(len, pairs)) > family.min_tokens
    expected = [sigmoid(family.reference(served.reference, ids)) for ids in pairs]
    assert_ranked_as(cohere_ranked(response), expected)


@pytest.mark.parametrize("family", family_ids([family for family in EMBEDDERS if family.ablated]))
def test_embeddings_differ_from_the_ablated_reference(serve, family):
    served = serve(family)
    ablated = family.ablated(served.folder)
    with openai_client(served) as client:
        response = client.embeddings.create(model=family.id, input=TEXTS, encoding_format="float")
    # the feature matters: without it some text gets another vector (not necessarily every one: with
    # tiny random weights a text may hardly depend on it)
    cosines = [cosine(ours, served.vector(text, ablated)) for text, ours in zip(TEXTS, vectors(response))]
    assert min(cosines) < 0.999, cosines


@pytest.mark.parametrize("family", family_ids([family for family in CROSS_ENCODERS if family.ablated]))
def test_cross_encoder_scores_differ_from_the_ablated_reference(serve, family):
    served = serve(family)
    ablated = family.ablated(served.folder)
    response = cohere_rerank(served, "v2", query=QUERY, documents=DOCUMENTS)
    gaps = [
        abs(score - sigmoid(family.reference(ablated, served.ids(QUERY, DOCUMENTS[index]))))
        for index, score in cohere_ranked(response)
    ]
    assert max(gaps) > 10 * SCORE_TOLERANCE, gaps  # some document's score depends on the feature


def embedder_tasks(family: Family) -> list[str]:
    """An embedder's tasks; one that mean-pools also serves contextualized embeddings (its chunks' spans
    pooled apart)."""
    contextualized = ["contextualized_embed"] if family.reference in MEAN_POOLED else []
    return ["embed", *contextualized, "rerank", "score", "pooling"]


@pytest.mark.parametrize(
    "family, tasks, matryoshka",
    [
        *[
            pytest.param(family, embedder_tasks(family), family.matryoshka, id=family.id)
            for family in EMBEDDERS
        ],
        # a sequence classifier also labels texts (/classify); a judge (a causal LM) only ranks
        *[
            pytest.param(family, ["rerank", "score", "classify"], None, id=family.id)
            for family in CROSS_ENCODERS
        ],
        pytest.param(QWEN3_RERANKER, ["rerank", "score"], None, id=QWEN3_RERANKER.id),
    ],
)
def test_models_list_describes_the_family(serve, family, tasks, matryoshka):
    served = serve(family)
    with httpx.Client(timeout=60.0, trust_env=False) as client:
        response = client.get(f"{served.url}/v1/models")
    assert response.status_code == 200, response.text
    [model] = [model for model in response.json()["data"] if model["id"] == family.id]
    assert (model["id"], model["tasks"], model["matryoshka"]) == (family.id, tasks, matryoshka)
    assert model["dimensions"] == (family.dimensions if "embed" in tasks else None)
    assert model["max_model_len"] == MAX_POSITIONS


def random_pngs(sizes, seed: int) -> tuple[list[bytes], list[str]]:
    """Random RGB PNGs of these (height, width) sizes, and their data URIs."""
    import base64
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    pngs = []
    for height, width in sizes:
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
        pngs.append(buffer.getvalue())
    return pngs, [f"data:image/png;base64,{base64.b64encode(data).decode()}" for data in pngs]


@pytest.mark.parametrize("family", family_ids(DUAL_ENCODERS))
def test_image_models_embed_texts_and_images_through_the_sdks(serve, family):
    """The OpenAI SDK's texts and image parts, and Cohere v2's images, on the one server beside the text
    families: each text the reference's text vector (SigLIP's padded to its window, as its processor
    pads), each image its image vector, from the PNG sent."""
    import io

    import torch
    from PIL import Image
    from transformers import AutoImageProcessor

    served = serve(family)
    text_config = served.reference.config.text_config
    pngs, uris = random_pngs(((40, 56), (64, 30)), seed=0)
    processor = AutoImageProcessor.from_pretrained(served.folder)
    pixels = processor(images=[Image.open(io.BytesIO(data)) for data in pngs], return_tensors="pt")
    with torch.inference_mode():  # SigLIP2 NaFlex's processor gives each image's patches, mask and grid
        output = served.reference.get_image_features(**pixels)
    output = output.pooler_output if hasattr(output, "pooler_output") else output
    expected_images = torch.nn.functional.normalize(output, dim=-1).numpy()
    padded = family in (SIGLIP, SIGLIP2)

    def text_vector(text: str) -> np.ndarray:
        ids = served.ids(text)
        if padded:
            ids = ids + [text_config.pad_token_id] * (text_config.max_position_embeddings - len(ids))
        return family.reference(served.reference, ids)

    parts = [TEXTS[0], {"type": "image_url", "image_url": {"url": uris[0]}}, TEXTS[2]]
    parts.append({"type": "image_url", "image_url": {"url": uris[1]}})
    with openai_client(served) as client:
        response = client.embeddings.create(model=family.id, input=parts)
    expected = [text_vector(TEXTS[0]), expected_images[0], text_vector(TEXTS[2]), expected_images[1]]
    for ours, theirs in zip(vectors(response), expected, strict=True):
        assert cosine(ours, theirs) >= SAME_VECTOR
    with cohere_client(cohere.ClientV2, served.url, timeout=60.0) as client:
        response = client.embed(model=family.id, input_type="image", images=uris, embedding_types=["float"])
    for ours, theirs in zip(response.embeddings.float_, expected_images, strict=True):
        assert cosine(np.asarray(ours, dtype=np.float32), theirs) >= SAME_VECTOR


@pytest.mark.parametrize("kind", list(VISION_LANGUAGE))
def test_vision_language_embedders_through_the_sdks(serve, kind):
    """gme-Qwen2-VL's and Qwen3-VL-Embedding's layouts of texts and images, through the OpenAI and Cohere
    SDKs, are transformers' vectors of them."""
    from benchmarks.image_checkpoints import EMBEDDER_LAYOUTS, embedder_vectors

    family = VISION_LANGUAGE[kind]
    served = serve(family)
    pngs, uris = random_pngs(((60, 90), (100, 50)), seed=1)
    layout = EMBEDDER_LAYOUTS[kind]
    text, *images = embedder_vectors(served.reference, served.folder, layout, TEXTS[:1], pngs)
    parts = [{"type": "image_url", "image_url": {"url": uris[0]}}, TEXTS[0]]
    with openai_client(served) as client:
        response = client.embeddings.create(model=family.id, input=parts)
    for ours, theirs in zip(vectors(response), [images[0], text], strict=True):
        assert cosine(ours, theirs) >= SAME_VECTOR
    with cohere_client(cohere.ClientV2, served.url, timeout=60.0) as client:
        response = client.embed(model=family.id, input_type="image", images=uris, embedding_types=["float"])
    for ours, theirs in zip(response.embeddings.float_, images, strict=True):
        assert cosine(np.asarray(ours, dtype=np.float32), theirs) >= SAME_VECTOR


def test_colpali_ranks_texts_through_the_sdk_and_embeds_pages(serve):
    """ColPali beside the text families: the Cohere SDK's rerank of texts is their MaxSim against the
    query's token vectors, and /pooling's token_embed of a page image its every token's vector, as
    transformers' ColPaliForRetrieval gives them."""
    from benchmarks.image_checkpoints import colpali_vectors

    served = serve(COLPALI)
    pngs, uris = random_pngs(((80, 60),), seed=2)
    query, *documents = colpali_vectors(served.reference, served.folder, [QUERY, *DOCUMENTS[:3], pngs[0]])
    max_sims = [float((query @ document.T).max(axis=1).sum()) for document in documents]
    with cohere_client(cohere.ClientV2, served.url, timeout=60.0) as client:
        response = client.rerank(model=COLPALI.id, query=QUERY, documents=DOCUMENTS[:3])
    expected = sorted(range(3), key=lambda index: -max_sims[index])
    assert [result.index for result in response.results] == expected
    for result in response.results:
        score = (1 + max_sims[result.index] / len(query)) / 2
        assert math.isclose(result.relevance_score, score, abs_tol=1e-4)
    part = {"type": "image_url", "image_url": {"url": uris[0]}}
    body = {"model": COLPALI.id, "task": "token_embed", "input": [part]}
    response = httpx.post(f"{served.url}/pooling", json=body, timeout=60.0)
    assert response.status_code == 200, response.text
    page = np.array(response.json()["data"][0]["data"], dtype=np.float32)
    assert page.shape == documents[-1].shape
    assert min(cosine(ours, theirs) for ours, theirs in zip(page, documents[-1])) >= SAME_VECTOR


def test_every_model_type_posy_packs_is_served_by_a_family(serve):
    """A row added to the model table (engine/models/registry.py) needs a family here to be tested."""
    configs = [json.loads((serve(family).folder / "config.json").read_text()) for family in SERVED]
    # a retriever's config wraps the model it packs (ColPali's PaliGemma)
    configs = [config.get(WRAPPED_CONFIGS.get(config["model_type"]), config) for config in configs]
    served = {config["model_type"] for config in configs}
    assert set(MODEL_TYPES) <= served, sorted(set(MODEL_TYPES) - served)


# Qwen3-Embedding: its tokenizer's <|endoftext|>, its prompts, Matryoshka dimensions, rerank by cosine


def test_qwen3_embedding_without_input_type_is_the_text_and_endoftext(qwen3_embedding):
    eos = qwen3_embedding.tokenizer.token_to_id("<|endoftext|>")
    assert all(qwen3_embedding.ids(text)[-1] == eos for text in TEXTS)
    with openai_client(qwen3_embedding) as client:
        response = client.embeddings.create(model=QWEN3_EMBEDDING.id, input=TEXTS, encoding_format="float")
    for text, ours in zip(TEXTS, vectors(response)):
        assert cosine(ours, qwen3_embedding.vector(text)) >= SAME_VECTOR, text


@pytest.mark.parametrize(
    "field, prompt_name",
    [("input_type", "query"), ("input_type", "document"), ("prompt_name", "query")],
)
def test_qwen3_embedding_prepends_the_prompt_the_request_names(qwen3_embedding, field, prompt_name):
    prompt = QWEN3_EMBEDDING_PROMPTS[prompt_name]
    with openai_client(qwen3_embedding) as client:
        response = client.embeddings.create(
            model=QWEN3_EMBEDDING.id, input=TEXTS, encoding_format="float", extra_body={field: prompt_name}
        )
    assert response.usage.prompt_tokens == sum(len(qwen3_embedding.ids(prompt + text)) for text in TEXTS)
    for text, ours in zip(TEXTS, vectors(response)):
        assert cosine(ours, qwen3_embedding.vector(prompt + text)) >= SAME_VECTOR, text
        if prompt:  # the prompt changes the vector
            assert cosine(ours, qwen3_embedding.vector(text)) < 0.999, text


def test_qwen3_embedding_dimensions_keep_the_first_values_renormalized(qwen3_embedding):
    with openai_client(qwen3_embedding) as client:
        full = vectors(
            client.embeddings.create(model=QWEN3_EMBEDDING.id, input=TEXTS, encoding_format="float")
        )
        short = vectors(client.embeddings.create(model=QWEN3_EMBEDDING.id, input=TEXTS, dimensions=16))
    assert short.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(
        short, full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True), atol=1e-5
    )
    for text, ours in zip(TEXTS, short):
        assert cosine(ours, qwen3_embedding.vector(text)[:16]) >= SAME_VECTOR, text


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_qwen3_embedding_reranks_by_cosine_of_its_prompted_vectors(qwen3_embedding, version):
    response = cohere_rerank(qwen3_embedding, version, query=QUERY, documents=DOCUMENTS)
    query = qwen3_embedding.vector(QWEN3_EMBEDDING_PROMPTS["query"] + QUERY)
    expected = [
        (1.0 + cosine(query, qwen3_embedding.vector(QWEN3_EMBEDDING_PROMPTS["document"] + document))) / 2.0
        for document in DOCUMENTS
    ]
    assert_ranked_as(cohere_ranked(response), expected)


# Qwen3-Reranker: a causal LM without sentence-transformers files is the yes/no judge


def judge_expected(served: Served, instruction: str | None = None) -> list[float]:
    return [
        judge_probability(served.reference, served.tokenizer, QUERY, document, instruction)
        for document in DOCUMENTS
    ]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_qwen3_reranker_scores_are_the_model_cards_p_yes(qwen3_reranker, version):
    response = cohere_rerank(qwen3_reranker, version, query=QUERY, documents=DOCUMENTS)
    assert_ranked_as(cohere_ranked(response), judge_expected(qwen3_reranker))


def test_qwen3_reranker_tei_rerank_gives_the_same_scores(serve):
    served = serve(QWEN3_RERANKER, alone=True)
    response = post(served, "/rerank", {"query": QUERY, "texts": DOCUMENTS})
    assert response.status_code == 200, response.text
    ranked = [(item["index"], item["score"]) for item in response.json()]
    assert_ranked_as(ranked, judge_expected(served))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_logit_score_cross_encoder_scores_as_sentence_transformers_predicts(serve, version):
    """The causal LM's chat template lays out each pair; the score is sigmoid("yes" - "no")."""
    served = serve(LOGIT_SCORE_RERANKER)
    response = cohere_rerank(served, version, query=QUERY, documents=DOCUMENTS)
    expected = served.reference.predict([(QUERY, document) for document in DOCUMENTS]).tolist()
    assert_ranked_as(cohere_ranked(response), expected)


def test_a_logit_score_cross_encoder_gives_the_log_odds_as_tei_raw_scores(serve):
    import torch

    served = serve(LOGIT_SCORE_RERANKER, alone=True)
    response = post(served, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    assert response.status_code == 200, response.text
    pairs = [(QUERY, document) for document in DOCUMENTS]
    expected = served.reference.predict(pairs, activation_fn=torch.nn.Identity()).tolist()
    assert_ranked_as([(item["index"], item["score"]) for item in response.json()], expected)


@pytest.mark.parametrize("route", ["/v1/rerank", "/v2/rerank", "/rerank"])
def test_qwen3_reranker_follows_the_request_instruction(serve, route):
    qwen3_reranker = serve(QWEN3_RERANKER, alone=route == "/rerank")
    body = {"query": QUERY, "instruction": CUSTOM_INSTRUCTION}
    if route == "/rerank":
        response = post(qwen3_reranker, route, {**body, "texts": DOCUMENTS})
        assert response.status_code == 200, response.text
        ranked = [(item["index"], item["score"]) for item in response.json()]
    else:
        response = post(qwen3_reranker, route, {**body, "model": QWEN3_RERANKER.id, "documents": DOCUMENTS})
        assert response.status_code == 200, response.text
        ranked = [(item["index"], item["relevance_score"]) for item in response.json()["results"]]
    expected = judge_expected(qwen3_reranker, CUSTOM_INSTRUCTION)
    assert_ranked_as(ranked, expected)
    # and the instruction matters: the default one gives other scores
    default = judge_expected(qwen3_reranker, JUDGE_INSTRUCTION)
    assert max(abs(a - b) for a, b in zip(expected, default)) > 10 * SCORE_TOLERANCE


def test_qwen3_reranker_does_not_embed(qwen3_reranker):
    with openai_client(qwen3_reranker) as client, pytest.raises(openai.BadRequestError, match="cannot embed"):
        client.embeddings.create(model=QWEN3_RERANKER.id, input=TEXTS[0])


# an architecture posy does not run: a causal LM head without sentence-transformers files (which the
# transformers fallback does not know how to pool), or any architecture posy does not pack under
# --model-impl posy


@pytest.mark.parametrize(
    "architecture, flags", [("GPT2LMHeadModel", []), ("GPT2Model", ["--model-impl", "posy"])]
)
def test_unsupported_architecture_exits_naming_it(tmp_path, architecture, flags):
    build_gpt2(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": [architecture]}))
    command = [
        sys.executable,
        "-m",
        "api",
        "serve",
        "--port",
        str(free_port()),
        "--model",
        str(tmp_path),
        *flags,
    ]
    try:
        finished = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=server_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=UNSUPPORTED_EXIT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"`posy serve` of a {architecture} checkpoint still ran after {UNSUPPORTED_EXIT_TIMEOUT_S:.0f} s"
        )
    output = finished.stdout + finished.stderr
    assert finished.returncode != 0, output
    assert architecture in output and "not supported" in output, output
    assert "Traceback" not in output, output
