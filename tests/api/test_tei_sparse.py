"""TEI's /embed_sparse as TEI clients read it: each weight written as float32's shortest form (as the dense
routes write theirs), for SPLADE and for bge-m3's lexical weights; an over-long input is TEI's 422 naming
TEI's own field (truncate), and truncate: true embeds it."""

import re

import numpy as np
import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from api.quantize import float_json
from benchmarks.token_checkpoints import m3_checkpoint, splade_checkpoint

TEXTS = ["what do cats eat?", "Cats eat fish, mostly.", "Ünïcödé façade; 東京 🙂"]
VALUE = re.compile(rb'"value":([^}]+)}')
# float32's shortest round-trip form never needs more than 9 significant digits; float64's needs up to 17
MAX_FLOAT32_DIGITS = 9


@pytest.fixture(scope="module")
def client(minilm_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse-models")
    models = (
        str(splade_checkpoint(minilm_path, root / "splade")),
        str(m3_checkpoint(minilm_path, root / "m3")),
    )
    config = ServerConfig(models=models, served_model_names=(("splade",), ("m3",)))
    with TestClient(create_app(config)) as test_client:
        yield test_client


def significant_digits(number: bytes) -> int:
    mantissa = number.split(b"e")[0].replace(b"-", b"").replace(b".", b"")
    return len(mantissa.lstrip(b"0").rstrip(b"0"))


def test_weights_are_float32s_shortest_form(client):
    """/embed_sparse serves the first model that does sparse embedding: the SPLADE one."""
    response = client.post("/embed_sparse", json={"inputs": TEXTS})
    assert response.status_code == 200, response.text
    texts = response.json()
    assert len(texts) == len(TEXTS) and all(texts)
    written = [VALUE.findall(part) for part in response.content.split(b"],[")]
    for text, values in zip(texts, written):
        assert [item["index"] for item in text] == sorted(item["index"] for item in text)
        assert len(values) == len(text)
        assert max(significant_digits(value) for value in values) <= MAX_FLOAT32_DIGITS
        # each exactly as the dense routes write the same float32 numbers
        weights = np.array([item["value"] for item in text], dtype=np.float32)
        assert bytes(float_json(weights))[1:-1].split(b",") == values


def test_bge_m3_lexical_weights_are_float32s_shortest_form(minilm_path, tmp_path):
    folder = m3_checkpoint(minilm_path, tmp_path / "m3")
    with TestClient(create_app(ServerConfig(models=(str(folder),)))) as client:
        response = client.post("/embed_sparse", json={"inputs": TEXTS[:2]})
    assert response.status_code == 200, response.text
    values = VALUE.findall(response.content)
    assert len(values) == sum(map(len, response.json())) > 0
    assert max(significant_digits(value) for value in values) <= MAX_FLOAT32_DIGITS


def test_an_over_long_input_is_a_422_naming_truncate(client):
    long_text = "word " * 300  # past the checkpoint's 128-token window
    refused = client.post("/embed_sparse", json={"inputs": [TEXTS[0], long_text]})
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["error_type"] == "Validation" and "input 1 has" in body["error"]
    assert "truncate: true" in body["error"] and "truncate_prompt_tokens" not in body["error"]
    for direction in ("Right", "Left"):
        body = {"inputs": [TEXTS[0], long_text], "truncate": True, "truncation_direction": direction}
        kept = client.post("/embed_sparse", json=body)
        assert kept.status_code == 200 and len(kept.json()) == 2
    assert client.get("/health").status_code == 200


def test_7m_characters_without_a_space_are_refused_untokenized_or_weigh_as_the_whole_texts_tokens(client):
    """Cut before tokenization to what the window reads (api/char_bound.py): one [UNK], as the whole text."""
    refused = client.post("/embed_sparse", json={"inputs": "a" * 7_000_000})
    assert refused.status_code == 422 and "input 0 has 7000000 characters" in refused.json()["error"]
    cut = client.post("/embed_sparse", json={"inputs": "a" * 7_000_000, "truncate": True})
    alike = client.post("/embed_sparse", json={"inputs": "a" * 200})  # one [UNK] too
    assert cut.status_code == alike.status_code == 200 and cut.json() == alike.json()


def test_info_describes_a_splade_model_as_tei_does(client):
    """The first served model (the SPLADE one) is an embedding model pooled by splade, not a reranker."""
    assert client.get("/info").json()["model_type"] == {"embedding": {"pooling": "splade"}}
