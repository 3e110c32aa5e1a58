"""/openapi.json describes every route with the request bodies the routes decode, and schemathesis,
driven by that schema, finds no input that makes the app answer 5xx."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from litestar.testing import TestClient
from schemathesis.checks import not_a_server_error

from api.app import create_app
from api.config import ServerConfig
from api.openapi import with_request_bodies

# bounded: about 50 generated requests per operation and mode, in well under a minute on two CPU cores
MAX_EXAMPLES = 50


def test_the_schema_lists_every_route_and_request_body(client):
    response = client.get("/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.1")
    paths = schema["paths"]
    assert set(paths) == {
        "/v1/embeddings",
        "/embeddings",
        "/v1/models",
        "/models",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/v2/embed",
        "/embed",
        "/tokenize",
        "/info",
        "/score",
        "/v1/score",
        "/pooling",
        "/v1/pooling",
        "/classify",
        "/v1/classify",
        "/embed_sparse",
        "/v1/contextualizedembeddings",
        "/health",
        "/ready",
        "/metrics",
    }
    bodies = {
        path: paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for path in paths
        if "post" in paths[path]
    }
    assert bodies == {
        "/v1/embeddings": "#/components/schemas/EmbeddingRequest",
        "/embeddings": "#/components/schemas/EmbeddingRequest",
        "/v1/rerank": "#/components/schemas/RerankRequest",
        "/v2/rerank": "#/components/schemas/RerankRequest",
        "/rerank": "#/components/schemas/TeiRerankRequest",
        "/v2/embed": "#/components/schemas/EmbedRequest",
        "/embed": "#/components/schemas/TeiEmbedRequest",
        "/tokenize": "#/components/schemas/TeiTokenizeRequest",
        "/score": "#/components/schemas/ScoreRequest",
        "/v1/score": "#/components/schemas/ScoreRequest",
        "/pooling": "#/components/schemas/PoolingRequest",
        "/v1/pooling": "#/components/schemas/PoolingRequest",
        "/classify": "#/components/schemas/ClassifyRequest",
        "/v1/classify": "#/components/schemas/ClassifyRequest",
        "/embed_sparse": "#/components/schemas/TeiEmbedSparseRequest",
        "/v1/contextualizedembeddings": "#/components/schemas/ContextualizedEmbeddingRequest",
    }
    components = schema["components"]["schemas"]
    assert components["EmbeddingRequest"]["required"] == ["input"]
    assert set(components["RerankRequest"]["required"]) == {"query", "documents"}
    assert components["EmbeddingResponse"]["properties"]["data"]["type"] == "array"
    encodings = components["EmbeddingRequest"]["properties"]["encoding_format"]["enum"]
    assert {"base64_int8", "base64_binary"} <= set(encodings)
    contextualized = components["ContextualizedEmbeddingRequest"]["properties"]
    assert {"input", "inputs", "dimensions", "encoding_format", "output_dtype"} <= set(contextualized)
    assert "ContextualizedEmbeddingResponse" in components


APP = create_app(ServerConfig())


async def without_lifespan(scope, receive, send):
    """APP as schemathesis reaches it. Schemathesis would start and stop APP's lifespan around each
    operation's test, and a stopped server stays draining: the module's fixture runs it once instead."""
    if scope["type"] == "lifespan":
        raise RuntimeError("APP's lifespan runs in the test module's fixture")
    await APP(scope, receive, send)


# the schema as /openapi.json serves it, read without starting the app (collection loads no model)
schema = schemathesis.openapi.from_dict(with_request_bodies(APP, APP.openapi_schema.to_schema()))
schema.app = without_lifespan
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
    max_examples=MAX_EXAMPLES,
)


@pytest.fixture(scope="module", autouse=True)
def running_app():
    with TestClient(APP):  # its lifespan: the model loaded, the engine running
        yield


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_generated_request_is_a_server_error(case):
    case.call_and_validate(checks=[not_a_server_error])


def test_every_request_field_says_what_it_does(client):
    schema = client.get("/openapi.json").json()
    bodies = {
        operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        for operations in schema["paths"].values()
        for operation in operations.values()
        if "requestBody" in operation
    }
    undocumented = [
        f"{body}.{field}"
        for body in sorted(bodies)
        for field, property_schema in schema["components"]["schemas"][body]["properties"].items()
        if not property_schema.get("description")
    ]
    assert len(bodies) == 11 and undocumented == []


def test_the_only_examples_are_the_ones_posy_writes(client):
    """No generated examples (Litestar's are random: an id of random letters, an embedding of 1.4e10)."""
    schema = client.get("/openapi.json").json()
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("example", "examples"):
                    found.append((where, value))
                else:
                    walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(schema, "")
    assert found and all("Request/" in where for where, _ in found), found
    assert ("/components/schemas/RerankRequest/properties/query", ["what do cats eat?"]) in found


def test_the_docs_page_shows_every_route_with_its_fields(client):
    response = client.get("/docs")
    assert response.status_code == 200 and response.headers["content-type"] == "text/html; charset=utf-8"
    page = response.text
    assert "<script" not in page and "http" not in page.replace("/openapi.json", "")  # nothing fetched
    schema = client.get("/openapi.json").json()
    for path, operations in schema["paths"].items():
        for method in operations:
            assert f"{method.upper()}</span> {path}</h2>" in page
    # a request's fields with their descriptions, bounds and examples; a route's description
    assert (
        "<code>dimensions</code>" in page
        and "re-normalized where the model&#x27;s vectors are (at least 1)" in page
    )
    assert "<code>max_tokens_per_doc</code>" in page and "Example: &quot;what do cats eat?&quot;" in page
    assert "OpenAI&#x27;s embeddings: one vector a text" in page
