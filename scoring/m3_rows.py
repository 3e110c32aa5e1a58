"""bge-m3's token rows (engine/models/bge_m3.py: a vector and a weight a token, in the columns its
HeadOutput declares) read per text: its dense vector (the first row's vector), its ColBERT vectors (every
later row's, the end token's included, as FlagEmbedding keeps it) and its lexical weights."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from engine.checkpoint.colbert import special_tokens
from engine.outputs import SPARSE_EMBED, TOKEN_EMBED, HeadOutput
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


def m3_outputs(
    rows: np.ndarray, token_ids: Sequence[Sequence[int]], unused: Collection[int], output: HeadOutput
) -> list[M3Output]:
    """Each text's three outputs from its whole token rows, their columns as the head declares them."""
    vector = slice(*output.task_rows[TOKEN_EMBED].columns)
    weight = output.task_rows[SPARSE_EMBED].columns[0]
    outputs = []
    for ids, part in zip(token_ids, split_rows(rows, [len(ids) for ids in token_ids])):
        outputs.append(
            M3Output(part[0, vector], part[1:, vector], lexical_weights(ids, part[:, weight], unused))
        )
    return outputs


def lexical_outputs(
    weights: np.ndarray, token_ids: Sequence[Sequence[int]], unused: Collection[int]
) -> list[dict[int, float]]:
    """Each text's lexical weights from its tokens' weights ([num_tokens, 1]: the sparse task's rows)."""
    parts = split_rows(weights, [len(ids) for ids in token_ids])
    return [lexical_weights(ids, part[:, 0], unused) for ids, part in zip(token_ids, parts)]
