"""An in-process app on the bundled model, shared by the API tests of a module."""

import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(ServerConfig())) as test_client:
        yield test_client
