"""HEAD is answered as GET is, status and headers alike, without a body: /health and /ready (load
balancers probe them with HEAD), ready or not, and any other GET route."""

import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from api.server import Server


@pytest.mark.parametrize("path", ["/health", "/ready", "/docs", "/v1/models", "/metrics"])
def test_head_answers_as_get_without_a_body(client, path):
    got, head = client.get(path), client.head(path)
    assert got.status_code == head.status_code == 200 and got.content and not head.content
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["x-request-id"] and head.headers["x-request-id"] != got.headers["x-request-id"]
    if path != "/metrics":  # its counts move between the two
        assert head.headers["content-length"] == got.headers["content-length"]


def test_head_of_ready_is_503_while_not_ready_and_of_a_post_route_405():
    server = Server(ServerConfig())
    with TestClient(create_app(server.config, server)) as client:
        server.draining = True
        head = client.head("/ready")
        assert head.status_code == 503 and not head.content
        assert head.headers["retry-after"] == "1" and head.headers["connection"] == "close"
        assert client.head("/health").status_code == 200  # alive all the same
        post_only = client.head("/v1/embeddings")
        assert post_only.status_code == 405 and not post_only.content
