"""A listwise ranker's checkpoint (jina-reranker-v3's JinaForRanking): its marker tokens, which end each
document's text and the query's in its prompt, and its projection's size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import UnsupportedModel

# the architectures of listwise rankers, as their configs name them
LISTWISE_ARCHITECTURES = ("JinaForRanking",)
DOCUMENT_MARKER = "<|embed_token|>"
QUERY_MARKER = "<|rerank_token|>"
PROJECTION_DIM = 512  # JinaForRanking's projector output (its modeling code fixes it)


@dataclass(frozen=True, slots=True)
class ListwiseConfig:
    document_token_id: int  # the token that ends each document's text
    query_token_id: int  # the one that ends the query's
    document_marker: str = DOCUMENT_MARKER  # their strings, as the prompt holds them
    query_marker: str = QUERY_MARKER
    projection_dim: int = PROJECTION_DIM


def read_listwise(name: str, tokenizer_path: Path) -> ListwiseConfig:
    """The markers' token ids, each one token of the model's tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    ids = [tokenizer.token_to_id(marker) for marker in (DOCUMENT_MARKER, QUERY_MARKER)]
    if None in ids:
        raise UnsupportedModel(
            f"model {name!r}: a listwise ranker's tokenizer needs the tokens {DOCUMENT_MARKER} and "
            f"{QUERY_MARKER}"
        )
    return ListwiseConfig(*ids)
