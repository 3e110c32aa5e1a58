"""bge-m3's token rows (engine/models/bge_m3.py: [vector | weight] a token) read per text: its dense
vector (the first row's vector), its ColBERT vectors (every later row's, the end token's included, as
FlagEmbedding keeps it) and its lexical weights."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from engine.colbert import special_tokens
from scoring.late_interaction import split_rows
from scoring.lexical import lexical_weights

# the tokens FlagEmbedding gives no lexical weight
UNUSED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")


def unused_token_ids(tokenizer: Tokenizer, tokenizer_dir: Path) -> frozenset[int]:
    special = special_tokens(tokenizer_dir)
    ids = (tokenizer.token_to_id(special[name]) for name in UNUSED_TOKENS if name in special)
    return frozenset(token for token in ids if token is not None)


@dataclass(frozen=True, slots=True)
class M3Output:
    dense: np.ndarray  # [dim]
    colbert: np.ndarray  # [num_tokens - 1, dim]
    lexical: dict[int, float]


def dense_vectors(first_rows: np.ndarray) -> np.ndarray:
    """[num_seqs, dim]: each text's dense vector, from its first row (the engine's `first_rows`)."""
    return np.ascontiguousarray(first_rows[:, :-1])


def m3_outputs(
    rows: np.ndarray, token_ids: Sequence[Sequence[int]], unused: Collection[int]
) -> list[M3Output]:
    outputs = []
    for ids, part in zip(token_ids, split_rows(rows, [len(ids) for ids in token_ids])):
        outputs.append(M3Output(part[0, :-1], part[1:, :-1], lexical_weights(ids, part[:, -1], unused)))
    return outputs
