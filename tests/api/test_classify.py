"""/classify (vLLM's): a sequence classifier's probabilities over its labels, against transformers' own
model in fp32, its label names, usage; and a 400 naming what a model serves where it classifies nothing."""

import json

import numpy as np
import pytest
import torch
from litestar.testing import TestClient
from transformers import AutoModelForSequenceClassification

from api.app import create_app
from api.config import ServerConfig
from tests.conftest import build_cross_encoder

TEXTS = ["A man is playing a guitar.", "The stock market fell today.", "stocks"]


@pytest.mark.parametrize("num_labels", [3, 1])
def test_classify_gives_the_classifiers_probabilities_and_label(
    minilm_path, minilm_tokenizer, tmp_path, num_labels
):
    folder = build_cross_encoder(minilm_path, tmp_path, num_labels=num_labels, seed=3)
    config = json.loads((folder / "config.json").read_text())
    names = ["negative", "neutral", "positive"][:num_labels]
    config["id2label"] = dict(enumerate(names))
    config["label2id"] = {name: index for index, name in enumerate(names)}
    (folder / "config.json").write_text(json.dumps(config))
    reference = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    ids = [encoding.ids for encoding in minilm_tokenizer.encode_batch(TEXTS)]
    with torch.inference_mode():
        logits = torch.cat([reference(torch.tensor([one])).logits for one in ids])
    expected = torch.sigmoid(logits) if num_labels == 1 else torch.softmax(logits, dim=-1)
    with TestClient(create_app(ServerConfig(models=(str(folder),)))) as client:
        response = client.post("/classify", json={"input": TEXTS})
        assert response.status_code == 200, response.text
        payload = response.json()
        tasks = client.get("/v1/models").json()["data"][0]["tasks"]
    assert tasks == (
        ["rerank", "score", "classify"] if num_labels == 1 else ["classify"]
    )  # 3 labels rank nothing
    assert payload["usage"]["prompt_tokens"] == sum(map(len, ids))
    for item, want in zip(payload["data"], expected.numpy()):
        np.testing.assert_allclose(item["probs"], want, atol=1e-5)
        assert item["num_classes"] == num_labels and item["object"] == "classify"
        assert item["label"] == names[int(np.argmax(want))]


def test_classify_on_an_embedder_is_a_400_naming_what_it_serves(client):
    response = client.post("/classify", json={"input": "a"})
    assert response.status_code == 400
    assert "embed (/v1/embeddings)" in response.json()["error"]["message"]
