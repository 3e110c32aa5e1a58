"""An in-process app on the bundled model, shared by the API tests of a module. It takes OpenAI token-id
inputs (--accept-token-ids): the tests send the bundled model's own ids, as references and hostile input."""

import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(ServerConfig(accept_token_ids=True))) as test_client:
        yield test_client
