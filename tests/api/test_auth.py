"""With an API key set, every route but /health and /ready answers 401 in the called API's shape unless
the request carries the key (Authorization: Bearer KEY, or x-api-key: KEY); POSY_API_KEY sets it too."""

import pytest
from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from api.app import create_app
from api.cli import apply_environment, build_parser, config_from_args
from api.config import ServerConfig
from benchmarks.token_checkpoints import splade_checkpoint
from tests.conftest import build_cross_encoder

KEY = "s3cret-key-42"
OPEN = {"/health", "/ready"}
# every guarded route with a request that succeeds once authorized, and its error shape
ROUTES = {
    "/v1/embeddings": ("POST", {"input": "x"}, "openai"),
    "/embeddings": ("POST", {"input": "x"}, "openai"),
    "/v1/models": ("GET", None, "openai"),
    "/models": ("GET", None, "openai"),
    "/metrics": ("GET", None, "openai"),
    "/openapi.json": ("GET", None, "openai"),
    "/docs": ("GET", None, "openai"),
    "/v1/rerank": ("POST", {"query": "q", "documents": ["d"]}, "cohere"),
    "/v2/rerank": ("POST", {"query": "q", "documents": ["d"]}, "cohere"),
    "/rerank": ("POST", {"query": "q", "texts": ["d"]}, "tei"),
    "/v2/embed": ("POST", {"texts": ["x"]}, "cohere"),
    "/embed": ("POST", {"inputs": "x"}, "tei"),
    "/tokenize": ("POST", {"inputs": "x"}, "tei"),
    "/info": ("GET", None, "tei"),
    "/score": ("POST", {"text_1": "q", "text_2": "d"}, "openai"),
    "/v1/score": ("POST", {"text_1": "q", "text_2": "d"}, "openai"),
    "/pooling": ("POST", {"input": "x"}, "openai"),
    "/v1/pooling": ("POST", {"input": "x"}, "openai"),
    "/classify": ("POST", {"input": "x"}, "openai"),
    "/v1/classify": ("POST", {"input": "x"}, "openai"),
    "/embed_sparse": ("POST", {"inputs": "x"}, "tei"),
    "/v1/contextualizedembeddings": ("POST", {"input": [["x", "y"]]}, "perplexity"),
}
WRONG = {
    "no header": {},
    "a wrong key": {"authorization": "Bearer wrong"},
    "the key but its last character": {"authorization": "Bearer " + KEY[:-1] + "3"},
    "the key with a character more": {"authorization": f"Bearer {KEY}x"},
    "a prefix of the key": {"authorization": "Bearer " + KEY[:-1]},
    "an empty key": {"authorization": "Bearer "},
    "the key without Bearer": {"authorization": KEY},
    "the key with another scheme": {"authorization": f"Basic {KEY}"},
    "a wrong x-api-key": {"x-api-key": KEY.upper()},
}
RIGHT = {
    "Bearer": {"authorization": f"Bearer {KEY}"},
    "bearer in lower case": {"authorization": f"bearer {KEY}"},
    "x-api-key": {"x-api-key": KEY},
}


@pytest.fixture(scope="module")
def client(minilm_path, tmp_path_factory):
    """The bundled model, a cross-encoder (for /classify) and a SPLADE model (for /embed_sparse)."""
    root = tmp_path_factory.mktemp("auth-models")
    models = (
        None,
        str(build_cross_encoder(minilm_path, root / "ce")),
        str(splade_checkpoint(minilm_path, root / "sp")),
    )
    with TestClient(create_app(ServerConfig(api_key=KEY, models=models))) as test_client:
        yield test_client


def call(client, route: str, headers: dict):
    method, body, _ = ROUTES[route]
    return client.request(method, route, json=body, headers=headers)


def assert_unauthorized(response, shape: str) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer" and response.headers["x-request-id"]
    payload = response.json()
    if shape == "openai":
        assert set(payload["error"]) == {"message", "type", "param", "code"}
        error = payload["error"]
        assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    elif shape == "cohere":
        assert list(payload) == ["message"]
    elif shape == "perplexity":
        assert list(payload) == ["detail"]
    else:
        assert set(payload) == {"error", "error_type"}
    assert KEY not in response.text


def test_the_routes_here_are_every_route_of_the_app(client):
    paths = {route.path for route in client.app.routes if isinstance(route, HTTPRoute)}
    paths = {path for path in paths if not path.startswith("/openapi.json/")}  # its 404 catch-all
    assert paths == set(ROUTES) | OPEN


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("headers", WRONG.values(), ids=WRONG.keys())
def test_every_route_refuses_a_request_without_the_key(client, route, headers):
    assert_unauthorized(call(client, route, headers), ROUTES[route][2])


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("headers", RIGHT.values(), ids=RIGHT.keys())
def test_every_route_answers_with_the_key(client, route, headers):
    response = call(client, route, headers)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("route", sorted(OPEN))
def test_health_and_ready_need_no_key(client, route):
    assert client.get(route).status_code == 200
    assert client.get(route, headers={"authorization": "Bearer wrong"}).status_code == 200


def test_the_key_from_posy_api_key():
    parser, serve = build_parser()
    apply_environment(serve, {"POSY_API_KEY": "from-the-environment"})
    config = config_from_args(parser.parse_args(["serve"]))
    with TestClient(create_app(config)) as client:
        assert_unauthorized(client.post("/v1/embeddings", json={"input": "x"}), "openai")
        assert_unauthorized(
            client.post("/v1/embeddings", json={"input": "x"}, headers={"authorization": f"Bearer {KEY}"}),
            "openai",
        )
        response = client.post(
            "/v1/embeddings", json={"input": "x"}, headers={"authorization": "Bearer from-the-environment"}
        )
        assert response.status_code == 200, response.text
