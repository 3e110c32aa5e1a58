"""An in-process app on the bundled model, shared by the API tests of a module. It takes OpenAI token-id
inputs (--accept-token-ids): the tests send the bundled model's own ids, as references and hostile input.
One on tiny pplx-embed checkpoints, shared by the Perplexity API's tests."""

from dataclasses import dataclass

import pytest
from litestar.testing import TestClient
from tokenizers import Tokenizer

from api.app import create_app
from api.config import ServerConfig


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(ServerConfig(accept_token_ids=True))) as test_client:
        yield test_client


@dataclass(frozen=True, slots=True)
class PplxServer:
    """An in-process app serving tiny pplx-embed-v1 and pplx-embed-context-v1 checkpoints under the names
    Perplexity's SDK knows, and the bundled model as "minilm"; the reference models on their weights."""

    client: TestClient
    references: dict  # served name -> transformers' Qwen3Model, non-causal
    tokenizer: Tokenizer  # both checkpoints'
    separator: int  # <|endoftext|>'s id

    def ids(self, texts: list[str]) -> list[list[int]]:
        return [self.tokenizer.encode(text).ids for text in texts]


PPLX_EMBED, PPLX_CONTEXT = "pplx-embed-v1-0.6b", "pplx-embed-context-v1-0.6b"


@pytest.fixture(scope="session")
def pplx(tmp_path_factory):
    from compat_tests.pplx_checkpoints import SEPARATOR, build_pplx_embed

    root = tmp_path_factory.mktemp("pplx-models")
    references = {
        PPLX_EMBED: build_pplx_embed(root / "v1"),
        PPLX_CONTEXT: build_pplx_embed(root / "context", contextual=True, seed=1),
    }
    tokenizer = Tokenizer.from_file(str(root / "v1" / "tokenizer.json"))
    config = ServerConfig(
        models=(str(root / "v1"), str(root / "context"), None),
        served_model_names=((PPLX_EMBED,), (PPLX_CONTEXT,), ("minilm",)),
    )
    with TestClient(create_app(config)) as client:
        yield PplxServer(client, references, tokenizer, tokenizer.token_to_id(SEPARATOR))
