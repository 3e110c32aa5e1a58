"""How a contextual embedder reads a document's chunks in one forward pass (pplx-embed-context's late
chunking): joined by a separator token that belongs to no chunk, as its remote class and tokenizer say."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.checkpoint.files import read_json
from engine.errors import UnsupportedModel

if TYPE_CHECKING:
    from engine.checkpoint.folder import Checkpoint

# remote classes (config.json's auto_map AutoModel, or its architecture) that embed a document's chunks read
# together, each the mean of its own tokens -> the separator their code joins the chunks with where the
# tokenizer's config names no sep_token
CONTEXTUAL_MODELS = {"PPLXQwen3ContextualModel": "<|endoftext|>"}


@dataclass(frozen=True, slots=True)
class ChunkJoin:
    """chunk_1 separator chunk_2 ... separator chunk_n: no separator before the first or after the last, and
    no separator's state in any chunk's mean."""

    separator: str  # the token, as the tokenizer writes it
    separator_id: int


def read_chunk_join(checkpoint: Checkpoint, tokenizer_path: Path) -> ChunkJoin | None:
    """The checkpoint's join, where its class is one of CONTEXTUAL_MODELS; None otherwise."""
    default = CONTEXTUAL_MODELS.get(checkpoint.remote_model) or CONTEXTUAL_MODELS.get(checkpoint.architecture)
    if default is None:
        return None
    from tokenizers import Tokenizer

    tokenizer_config = read_json(checkpoint.transformer_dir / "tokenizer_config.json") or {}
    separator = tokenizer_config.get("sep_token") or default
    if isinstance(separator, dict):  # an AddedToken as transformers saves it
        separator = separator.get("content", "")
    separator_id = Tokenizer.from_file(str(tokenizer_path)).token_to_id(separator)
    if separator_id is None:
        raise UnsupportedModel(
            f"model {checkpoint.name!r}: it joins a document's chunks with {separator!r}, which its "
            "tokenizer lacks"
        )
    return ChunkJoin(separator, separator_id)
