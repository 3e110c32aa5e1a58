"""GET /v1/models lists every task each model serves, in OpenAI's list shape: each listed task's route
answers that model, and each route it does not list is a 400 for it (one server: the bundled embedder, a
cross-encoder, a 3-label classifier, ColBERT, SPLADE and bge-m3, tiny random checkpoints)."""

import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from benchmarks.token_checkpoints import colbert_checkpoints, m3_checkpoint, splade_checkpoint
from tests.conftest import build_cross_encoder

# a request for each task that names its model (/embed_sparse has no model field: the first SPLADE-like)
REQUESTS = {
    "embed": ("/v1/embeddings", {"input": "a cat"}),
    "contextualized_embed": ("/v1/contextualizedembeddings", {"input": [["a cat", "sat on the mat"]]}),
    "rerank": ("/v1/rerank", {"query": "a cat", "documents": ["fish", "rails"]}),
    "score": ("/score", {"text_1": "a cat", "text_2": ["fish", "rails"]}),
    "pooling": ("/pooling", {"input": "a cat"}),
    "token_embed": ("/pooling", {"input": "a cat", "task": "token_embed"}),
    "classify": ("/classify", {"input": "a cat"}),
}
EXPECTED = {
    "minilm": ["embed", "contextualized_embed", "rerank", "score", "pooling"],
    "cross-encoder": ["rerank", "score", "classify"],
    "classifier": ["classify"],
    "colbert": ["token_embed", "rerank", "score", "pooling"],
    "splade": ["sparse_embed"],
    "m3": ["embed", "token_embed", "sparse_embed", "rerank", "score", "pooling"],
}


@pytest.fixture(scope="module")
def client(minilm_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    _, pylate = colbert_checkpoints(minilm_path, root / "colbert")
    folders = {
        "minilm": None,
        "cross-encoder": str(build_cross_encoder(minilm_path, root / "cross-encoder")),
        "classifier": str(build_cross_encoder(minilm_path, root / "classifier", num_labels=3)),
        "colbert": str(pylate),
        "splade": str(splade_checkpoint(minilm_path, root / "splade")),
        "m3": str(m3_checkpoint(minilm_path, root / "m3")),
    }
    config = ServerConfig(
        models=tuple(folders.values()), served_model_names=tuple((name,) for name in folders)
    )
    with TestClient(create_app(config)) as test_client:
        yield test_client


def test_models_keep_openais_list_shape_and_list_their_tasks(client):
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list"
    for model in listed["data"]:
        assert (
            model["object"] == "model" and model["owned_by"] == "posy" and isinstance(model["created"], int)
        )
    assert {model["id"]: model["tasks"] for model in listed["data"]} == EXPECTED


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_listed_task_is_served_and_no_other(client, name):
    tasks = {model["id"]: model["tasks"] for model in client.get("/v1/models").json()["data"]}[name]
    for task, (path, body) in REQUESTS.items():
        response = client.post(path, json={**body, "model": name})
        if task in tasks:
            assert response.status_code == 200, (task, response.text)
        else:
            assert response.status_code == 400, (task, response.text)
    if "sparse_embed" in tasks and name == "splade":  # the first model that serves it
        assert client.post("/embed_sparse", json={"inputs": "a cat"}).status_code == 200
