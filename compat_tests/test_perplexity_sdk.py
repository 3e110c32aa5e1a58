"""The official perplexityai SDK (and voyageai's contextualized_embed) against a live server serving tiny
pplx-embed-v1 and pplx-embed-context-v1 checkpoints in their published layouts, under the names the SDK
knows: each decoded as Perplexity's docs decode it, against the reference computation (transformers'
Qwen3Model, non-causal; int8 within a code of the reference quantizer's, equal away from rounding
boundaries; floats within 1e-5)."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import voyageai
import voyageai.error
from perplexity import BadRequestError, Perplexity
from tokenizers import Tokenizer

from .families import CPU_FLOAT32
from .pplx_checkpoints import (
    SEPARATOR,
    assert_same_bits,
    assert_same_int8,
    build_pplx_embed,
    reference_chunks,
    reference_vector,
)
from .test_readme import PERPLEXITY_EXAMPLES, run_example

TOLERANCE = 1e-5
EMBED, CONTEXT = "pplx-embed-v1-0.6b", "pplx-embed-context-v1-0.6b"
TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    "Someone plays an old guitar by the river at night.",
]
DOCUMENTS = [
    ["Berlin is the capital of Germany.", "The city has 3.8 million inhabitants.", "It is also a state."],
    ["Emperor penguins raise their chicks on the Antarctic sea ice through the long dark winter."],
]


@pytest.fixture(scope="module")
def served(server_factory, tmp_path_factory):
    root = tmp_path_factory.mktemp("pplx")
    references = {
        EMBED: build_pplx_embed(root / "v1"),
        CONTEXT: build_pplx_embed(root / "ctx", contextual=True),
    }
    models = ("--model", str(root / "v1"), "--model", str(root / "ctx"))
    args = (*models, "--served-model-name", EMBED, "--served-model-name", CONTEXT)  # the Nth names the Nth
    server = server_factory(*args, *CPU_FLOAT32)
    return server.url, references, Tokenizer.from_file(str(root / "v1" / "tokenizer.json"))


@pytest.fixture(scope="module")
def client(served):
    with Perplexity(api_key="unused", base_url=served[0], max_retries=0) as client:  # the root, not /v1
        yield client


def int8_rows(response) -> np.ndarray:
    return np.stack(
        [np.frombuffer(base64.b64decode(item.embedding), dtype=np.int8) for item in response.data]
    )


def bit_rows(response) -> np.ndarray:
    packed = [np.frombuffer(base64.b64decode(item.embedding), dtype=np.uint8) for item in response.data]
    return np.unpackbits(np.stack(packed), axis=1, bitorder="little")  # "LSB first", as the docs decode


def expected_vectors(served, texts) -> np.ndarray:
    _, references, tokenizer = served
    return np.stack([reference_vector(references[EMBED], tokenizer.encode(text).ids) for text in texts])


def test_embeddings_default_to_int8_of_the_raw_vector(client, served):
    response = client.embeddings.create(model=EMBED, input=TEXTS)
    assert [item.index for item in response.data] == [0, 1, 2] and response.model == EMBED
    assert_same_int8(int8_rows(response), expected_vectors(served, TEXTS), TOLERANCE)
    num_tokens = sum(len(served[2].encode(text).ids) for text in TEXTS)
    usage = response.usage
    assert (usage.prompt_tokens, usage.total_tokens) == (num_tokens, num_tokens)
    assert (usage.cost.input_cost, usage.cost.total_cost, usage.cost.currency) == (0.0, 0.0, "USD")
    explicit = client.embeddings.create(model=EMBED, input=TEXTS, encoding_format="base64_int8")
    assert np.array_equal(int8_rows(explicit), int8_rows(response))


def test_binary_and_dimensions(client, served):
    expected = expected_vectors(served, TEXTS)
    binary = client.embeddings.create(model=EMBED, input=TEXTS, encoding_format="base64_binary")
    assert_same_bits(bit_rows(binary), expected, TOLERANCE)
    short = client.embeddings.create(model=EMBED, input=TEXTS[0], dimensions=32)
    assert_same_int8(int8_rows(short), expected[:1, :32], TOLERANCE)
    short_bits = client.embeddings.create(
        model=EMBED, input=TEXTS, dimensions=32, encoding_format="base64_binary"
    )
    assert_same_bits(bit_rows(short_bits), expected[:, :32], TOLERANCE)


def test_contextualized_embeddings(client, served):
    _, references, tokenizer = served
    response = client.contextualized_embeddings.create(model=CONTEXT, input=DOCUMENTS)
    separator = tokenizer.token_to_id(SEPARATOR)
    assert [document.index for document in response.data] == [0, 1]
    for document, chunks in zip(response.data, DOCUMENTS):
        assert [item.index for item in document.data] == list(range(len(chunks)))
        ids = [tokenizer.encode(chunk).ids for chunk in chunks]
        assert_same_int8(
            int8_rows(document), reference_chunks(references[CONTEXT], ids, separator), TOLERANCE
        )
    num_tokens = sum(len(tokenizer.encode(chunk).ids) for chunks in DOCUMENTS for chunk in chunks) + 2
    assert response.usage.total_tokens == num_tokens and response.usage.cost.total_cost == 0.0
    binary = client.contextualized_embeddings.create(
        model=CONTEXT, input=DOCUMENTS[:1], encoding_format="base64_binary", dimensions=16
    )
    ids = [tokenizer.encode(chunk).ids for chunk in DOCUMENTS[0]]
    expected = reference_chunks(references[CONTEXT], ids, separator)[:, :16]
    assert_same_bits(bit_rows(binary.data[0]), expected, TOLERANCE)


def test_limits_are_the_sdks_bad_request(client):
    with pytest.raises(BadRequestError) as raised:
        client.contextualized_embeddings.create(model=CONTEXT, input=[["a", ""]])
    assert raised.value.status_code == 400 and "empty string" in raised.value.body["detail"]
    with pytest.raises(BadRequestError):
        client.contextualized_embeddings.create(model=CONTEXT, input=[["a"]] * 513)


def test_voyage_contextualized_embed(served):
    url, references, tokenizer = served
    client = voyageai.Client(api_key="unused", base_url=f"{url}/v1")
    result = client.contextualized_embed(inputs=DOCUMENTS, model=CONTEXT)  # the SDK asks for base64
    separator = tokenizer.token_to_id(SEPARATOR)
    for found, chunks in zip(result.results, DOCUMENTS):
        ids = [tokenizer.encode(chunk).ids for chunk in chunks]
        expected = reference_chunks(references[CONTEXT], ids, separator)
        np.testing.assert_allclose(np.array(found.embeddings), expected, atol=TOLERANCE, rtol=0)
    assert (
        result.total_tokens == sum(len(tokenizer.encode(c).ids) for chunks in DOCUMENTS for c in chunks) + 2
    )
    codes = client.contextualized_embed(
        inputs=DOCUMENTS[:1], model=CONTEXT, output_dtype="int8", output_dimension=8
    )
    ids = [tokenizer.encode(chunk).ids for chunk in DOCUMENTS[0]]
    expected = reference_chunks(references[CONTEXT], ids, separator)[:, :8]
    assert_same_int8(np.array(codes.results[0].embeddings, dtype=np.int8), expected, TOLERANCE)
    with pytest.raises(voyageai.error.InvalidRequestError, match="empty string"):
        client.contextualized_embed(inputs=[["a", ""]], model=CONTEXT)


def test_the_readme_example_runs(served):
    assert PERPLEXITY_EXAMPLES
    for example in PERPLEXITY_EXAMPLES:
        run_example(example, served[0])
